"""The CLI's client of a running gateway (``gateway_json``, used by ``fermix status``,
``agents``, ``usage``, ...) and ``fermix agent``, which streams the reply to stdout and the
run's tool calls to stderr (fermix_cli/tool_events.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from fermix_cli.tool_events import ToolLines
from fermix_shared.errors import FermixError
from fermix_shared.settings import Settings


class ClientError(FermixError):
    """A failure the CLI reports as one sentence with a non-zero exit code."""


class GatewayRefused(ClientError):
    """The gateway answered a request with an error status; ``reason`` is its sentence (the
    ``detail`` or ``error`` of its JSON body), or the start of the body."""

    def __init__(self, what: str, status: int, reason: str):
        super().__init__(f"the gateway refused the {what} (HTTP {status}): {reason}")
        self.status = status
        self.reason = reason


Command = Callable[[argparse.Namespace], int]


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more (else the sentence argparse prints)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, not {text!r}")
    return int(text)


def refusals_as_exit_1(*statuses: int) -> Callable[[Command], Command]:
    """Wrap a subcommand: a gateway refusal with one of ``statuses`` prints the gateway's own
    sentence (``fermix: <reason>``) and exits 1; anything else propagates."""

    def wrap(func: Command) -> Command:
        def run(a: argparse.Namespace) -> int:
            try:
                return func(a)
            except GatewayRefused as e:
                if e.status in statuses:
                    print(f"fermix: {e.reason}", file=sys.stderr)
                    return 1
                raise

        return run

    return wrap


def _headers(settings: Settings) -> dict[str, str]:
    if settings.api_token is None:
        return {}
    return {"Authorization": f"Bearer {settings.api_token.get_secret_value()}"}


def _sse(resp: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """Parse ``event:``/``data:`` blocks from an SSE response (comments, i.e. the gateway's
    keepalives, are skipped)."""
    event, data = "message", ""
    for line in resp.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif not line and data:
            yield event, json.loads(data)
            event, data = "message", ""


def _terminal(stream: str, data: dict[str, Any]) -> bool:
    """The run's last event: lifecycle end or error, but not a transient error (the turn's
    worker died and it is resuming on another; a new start follows). Same rule as
    ``RunEvent.terminal``."""
    return stream == "lifecycle" and data.get("phase") in ("end", "error") \
        and not data.get("transient")


@dataclass
class _Run:
    """What the streaming thread learned, read by the waiting thread once it is done (or
    its deadline passed)."""

    tools: ToolLines
    as_json: bool = False  # the reply is printed in a JSON document at the end, not streamed
    run_id: str | None = None
    final: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False
    midline: bool = False  # the reply streamed so far does not end with a newline
    error: BaseException | None = None
    abandoned: bool = False  # the caller gave up: write nothing more to ``out``
    sock: socket.socket | None = None  # of the event stream, to cut it when abandoned
    lock: threading.Lock = field(default_factory=threading.Lock)

    def abandon(self) -> None:
        """Stop writing and wake the stream's blocked read (shutdown, unlike close, does)."""
        with self.lock:
            self.abandoned = True
            if self.sock is not None:
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)


def _stream_run(http: httpx.Client, body: dict[str, Any], run: _Run, out: TextIO) -> None:
    """Start the run, copy its assistant deltas to ``out`` until its terminal event, then
    read its record into ``run.final``. Runs in a daemon thread; failures land in ``run``."""
    try:
        with http:
            resp = http.post("/v1/agent", json=body)
            if resp.status_code != 202:
                raise ClientError(
                    f"the gateway refused the message (HTTP {resp.status_code}): {resp.text}")
            run.run_id = resp.json()["runId"]
            with http.stream("GET", f"/v1/runs/{run.run_id}/events") as events:
                with run.lock:
                    if run.abandoned:
                        return
                    stream = events.extensions.get("network_stream")
                    run.sock = stream.get_extra_info("socket") if stream is not None else None
                for kind, data in _sse(events):
                    if _terminal(kind, data):
                        break
                    with run.lock:
                        if run.abandoned:
                            return
                        _show(run, kind, data, out)
            if not run.abandoned:
                run.final = http.get(f"/v1/runs/{run.run_id}").json()
    except BaseException as e:  # handed to the waiting thread, which reports it
        run.error = e


def _show(run: _Run, kind: str, data: dict[str, Any], out: TextIO) -> None:
    """One event of the stream: a piece of the reply to ``out``, a tool call to stderr."""
    if kind == "assistant" and not run.as_json:
        delta = data.get("delta", "")
        out.write(delta)
        out.flush()
        run.streamed = True
        run.midline = (not delta.endswith("\n")) if delta else run.midline
    elif kind == "tool":
        if run.midline and run.tools.on_terminal and out.isatty():
            out.write("\n")  # the same screen: the tool's line starts a line of its own
            out.flush()
            run.midline = False
        run.tools.event(data)


def run_agent(
    settings: Settings,
    message: str,
    chat: str | None,
    timeout: float,
    out: TextIO = sys.stdout,
    agent: str | None = None,
    err: TextIO | None = None,
    as_json: bool = False,
) -> int:
    """Start a run, stream its reply to ``out`` and its tool calls to ``err`` (stderr);
    returns the exit code (0 ok, 1 failed). ``as_json``: nothing streams to ``out``; the
    run's record and its tool calls are printed there as one JSON document at the end.

    ``timeout`` (seconds, ``0`` = none) bounds the whole call, whatever the stream carries
    (the gateway sends a keepalive every second, so a per-read timeout would never fire): the
    streaming runs in a daemon thread and this one waits for it with the deadline. On expiry
    the run goes on on the server; the error says so and names the run.
    """
    base = settings.gateway_url.rstrip("/")
    body: dict[str, Any] = {"message": message}
    if chat:
        body["chatId"] = chat
    if agent:
        body["agent"] = agent
    run = _Run(ToolLines(sys.stderr if err is None else err), as_json)
    read = timeout if timeout > 0 else None
    http = httpx.Client(base_url=base, headers=_headers(settings),
                        timeout=httpx.Timeout(read, connect=min(5.0, read or 5.0)))
    worker = threading.Thread(target=_stream_run, args=(http, body, run, out),
                              name="fermix-agent-stream", daemon=True)
    worker.start()
    worker.join(read)
    if worker.is_alive():
        run.abandon()
        if run.streamed:
            out.write("\n")
        if run.run_id is None:
            raise ClientError(
                f"the gateway at {base} did not accept the message within {timeout:g} s")
        raise ClientError(
            f"no answer within {timeout:g} s; run {run.run_id} is still running on the gateway "
            f"(GET /v1/runs/{run.run_id} shows how it ends)"
        )
    if isinstance(run.error, httpx.ConnectError):
        raise ClientError(f"cannot reach the gateway at {base} ({run.error}); "
                          "is `fermix dev` running?") from run.error
    if isinstance(run.error, httpx.TimeoutException):
        raise ClientError(
            f"the gateway at {base} did not answer within {timeout:g} s") from run.error
    if isinstance(run.error, httpx.HTTPError):
        raise ClientError(f"the connection to the gateway at {base} failed ({run.error})") \
            from run.error
    if run.error is not None:
        raise run.error
    return _report(run, out)


def _report(run: _Run, out: TextIO) -> int:
    """Finish the output of a run whose stream ended: 0 when it answered, else ClientError."""
    final = run.final
    if run.as_json and final:
        out.write(json.dumps({**final, "tools": run.tools.calls}, indent=2) + "\n")
        out.flush()
        if final.get("status") == "ok":
            return 0
    elif final.get("status") == "ok":
        # The streamed text may include a silent token the final reply drops; print the reply
        # itself when nothing was streamed.
        if not run.streamed:
            out.write(final.get("reply", ""))
        out.write("\n")
        return 0
    if run.streamed:
        out.write("\n")
    if final.get("status") in ("queued", "running"):
        raise ClientError(f"the event stream of run {run.run_id} closed before the run ended; "
                          f"it is still {final.get('status')} on the gateway")
    raise ClientError(
        f"run {run.run_id} ended {final.get('status')}: {final.get('error', 'no reply')}")


def _reason(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    if isinstance(body, dict) and isinstance(body.get("detail") or body.get("error"), str):
        return str(body.get("detail") or body.get("error"))
    return resp.text[:200]


def gateway_json(settings: Settings, method: str, path: str, what: str, *,
                 params: dict[str, Any] | None = None,
                 payload: dict[str, Any] | None = None,
                 timeout: float = 10) -> dict[str, Any]:
    """``method path`` on the gateway (with query ``params`` and a JSON ``payload``), its JSON
    body when it answers 2xx. ClientError when it cannot be reached within ``timeout``
    seconds; GatewayRefused (``what`` names the request) on another status."""
    base = settings.gateway_url.rstrip("/")
    try:
        resp = httpx.request(method, f"{base}{path}", headers=_headers(settings),
                             params=params, json=payload, timeout=httpx.Timeout(timeout, connect=5))
    except httpx.ConnectError as e:
        raise ClientError(
            f"cannot reach the gateway at {base} ({e}); is `fermix dev` running?") from e
    except httpx.TimeoutException as e:
        raise ClientError(f"the gateway at {base} did not answer within {timeout:g} s") from e
    except httpx.HTTPError as e:
        raise ClientError(f"the connection to the gateway at {base} failed ({e})") from e
    if not resp.is_success:
        raise GatewayRefused(what, resp.status_code, _reason(resp))
    body: dict[str, Any] = resp.json()
    return body


def get_status(settings: Settings) -> dict[str, Any]:
    """``GET /v1/status`` from the gateway, as parsed JSON."""
    return gateway_json(settings, "GET", "/v1/status", "status request")
