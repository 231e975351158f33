"""The worker's side of the pipe to its MCP host process (fermix_worker/mcp/host.py).

Written against ``threading`` and ``subprocess`` looked up at run time, which is the whole
trick: under the gevent pool they are gevent's (monkey-patched before Fermix is imported),
so the reader is a greenlet, a wait is a cooperative ``Event.wait`` and pipe I/O yields to
the hub; under the threads or solo pool, or in a test, they are the real ones. Either way no
thread of the worker ever runs asyncio, and no greenlet is blocked by another thread.

The host is started on first use and again after it died; a request in flight when it dies
fails at once. A host that does not answer within the bound it was given is wedged: it is
killed, and the next request starts a new one. A call the worker gives up (a tool timeout, a
/stop) is cancelled in the host, which has the SDK tell the server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from fermix_shared.errors import FermixError
from fermix_shared.mcp_config import McpServerConfig
from fermix_worker.mcp.wire import HOST_SERVERS_ENV, encode

log = logging.getLogger(__name__)

HOST_ARGV = (sys.executable, "-m", "fermix_worker.mcp.host")
# Seconds the host gets to stop its servers when closed (the SDK gives a stdio child 2 s to
# exit after its stdin closes, then terminates it).
CLOSE_GRACE_S = 8.0


class McpUnavailable(FermixError):
    """A request could not be answered; ``str(e)`` is the model's error ("MCP server ...")."""


class Reply:
    """The answer to one request, set by the reader (a greenlet under gevent, else a thread)."""

    def __init__(self, rid: int, server: str):
        self.id = rid
        self.server = server
        self._event = threading.Event()
        self._message: dict[str, Any] = {}

    def set(self, message: dict[str, Any]) -> None:
        self._message = message
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    def result(self) -> Any:
        """The answer's payload; McpUnavailable with the error if the request failed."""
        if "ok" in self._message:
            return self._message["ok"]
        raise McpUnavailable(str(self._message.get("error") or
                                 f"MCP server {self.server!r} sent no answer"))


class McpHost:
    """This worker process's MCP host: one child process that owns every MCP session."""

    def __init__(self, servers: Sequence[McpServerConfig], argv: Sequence[str] = HOST_ARGV):
        self._servers = json.dumps([s.model_dump(mode="json") for s in servers])
        self._argv = list(argv)
        self._lock = threading.Lock()  # the process handle and the pending replies
        self._write_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending: dict[int, Reply] = {}
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        """The host process's pid while it runs (tests kill it)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def submit(self, op: str, server: str, **fields: Any) -> Reply:
        """Send a request and return at once; the reply is set when the host answers."""
        with self._lock:
            proc = self._running()
            reply = Reply(next(self._ids), server)
            self._pending[reply.id] = reply
        self._write(proc, {"id": reply.id, "op": op, "server": server, **fields})
        return reply

    def request(self, op: str, server: str, timeout: float, **fields: Any) -> Any:
        """Send a request and wait for its answer, at most ``timeout`` seconds. A wait cut
        short (``gevent.Timeout``, an interrupt) cancels the request."""
        reply = self.submit(op, server, **fields)
        try:
            if not reply.wait(timeout):
                self.kill(f"it did not answer within {timeout:g} s")
            return reply.result()
        finally:
            if not reply.done():
                self.cancel(reply)
            self.forget(reply)

    def cancel(self, reply: Reply) -> None:
        """Give up a request: the host cancels it (the SDK sends the server
        ``notifications/cancelled`` for a call) and answers nothing; the reply is forgotten."""
        with self._lock:
            proc = self._proc
            pending = self._pending.pop(reply.id, None)
        if proc is None or pending is None:  # answered, or the host is gone (and so the call)
            return
        with contextlib.suppress(McpUnavailable):
            self._write(proc, {"id": reply.id, "op": "cancel", "server": reply.server})

    def forget(self, reply: Reply) -> None:
        """Drop a reply nobody waits for any more (its answer, if it comes, is ignored)."""
        with self._lock:
            self._pending.pop(reply.id, None)

    def kill(self, reason: str) -> None:
        """Stop the host (wedged, or at shutdown); requests in flight fail with ``reason``."""
        with self._lock:
            proc = self._proc
        if proc is not None:
            log.warning("stopping the MCP host process %s: %s", proc.pid, reason)
            self._lost(proc, reason)
            proc.kill()
            proc.wait()

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop the host the gentle way: closing its stdin lets it stop its servers; killed if
        it has not exited after ``grace_s``. The next request starts a new one."""
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        self._lost(proc, "the MCP host process was stopped")  # closes its stdin
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        # The configuration holds no secrets (only ${NAME} references the host expands).
        env = {**os.environ, HOST_SERVERS_ENV: self._servers}
        proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env)
        log.info("started the MCP host process %s", proc.pid)
        self._proc = proc
        reader = threading.Thread(target=self._read, args=(proc,), name="mcp-host-reader",
                                  daemon=True)
        reader.start()
        return proc

    def _write(self, proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        stdin: IO[bytes] | None = proc.stdin
        assert stdin is not None
        try:
            with self._write_lock:
                stdin.write(encode(message))
                stdin.flush()
        except (OSError, ValueError) as e:  # ValueError: the pipe was closed meanwhile
            self._lost(proc, f"its pipe broke ({e})")
            raise McpUnavailable(
                f"MCP server {message.get('server')!r} could not be reached: the MCP host "
                f"process is gone ({e}); it is restarted on the next call") from None
        except BaseException:
            # Interrupted halfway through a line (a timeout, /stop): the pipe is out of step.
            self._lost(proc, "a request was cut off")
            proc.kill()
            raise

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        stdout = proc.stdout
        assert stdout is not None
        for line in iter(stdout.readline, b""):
            try:
                message = json.loads(line)
                rid = message["id"]
            except (ValueError, KeyError, TypeError):
                log.warning("the MCP host wrote a line that is not an answer: %.200r", line)
                continue
            with self._lock:
                reply = self._pending.pop(rid, None)
            if reply is not None:
                reply.set(message)
        code = proc.wait()
        stdout.close()
        self._lost(proc, f"the MCP host process exited with code {code}")

    def _lost(self, proc: subprocess.Popen[bytes], reason: str) -> None:
        with self._lock:
            if self._proc is not proc:
                return
            self._proc = None
            pending, self._pending = self._pending, {}
        for reply in pending.values():
            reply.set({"error": f"MCP server {reply.server!r} could not be reached: {reason}; "
                                "it is restarted on the next call"})
        if proc.stdin is not None:  # the host reads EOF and stops, if it still runs
            with contextlib.suppress(OSError):
                proc.stdin.close()

