"""The MCP host process: ``python -m fermix_worker.mcp.host``, one per worker process.

It owns every MCP session of its worker on one asyncio event loop and answers the worker's
requests over stdin/stdout (fermix_worker/mcp/wire.py), many at once. It is a process of its
own, not a thread, because the worker runs under gevent's monkey-patching, and the SDK's
asyncio cannot start a stdio server from a thread there (gevent's patched ``subprocess``
watches children only from the main thread's loop). Here nothing is patched.

It exits when its stdin closes (the worker exited or died) or on SIGTERM, closing the
sessions: stdio children are stopped the SDK's way (stdin closed, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, BinaryIO

from pydantic import TypeAdapter

from fermix_shared.mcp_config import McpServerConfig
from fermix_worker.mcp.sessions import McpFailure, ServerSession, describe
from fermix_worker.mcp.wire import HOST_SERVERS_ENV, MAX_LINE_BYTES, encode

log = logging.getLogger("fermix.mcp.host")

Send = Callable[[dict[str, Any]], Awaitable[None]]


async def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    requests, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                               stdin)
    # SIGTERM (a stop of the worker's process group) ends the requests like an EOF does, so
    # the servers are still stopped the SDK's way.
    loop.add_signal_handler(signal.SIGTERM, requests.close)
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), stdout)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def send(message: dict[str, Any]) -> None:
        try:
            writer.write(encode(message))
            await writer.drain()
        except ConnectionError:  # the worker is gone; its EOF ends us
            log.info("the worker stopped reading; answer %s dropped", message.get("id"))

    raw = os.environ.get(HOST_SERVERS_ENV, "[]")
    configs = TypeAdapter(list[McpServerConfig]).validate_json(raw)
    servers = {c.name: ServerSession(c, os.environ) for c in configs}
    log.info("serving %d MCP server(s): %s", len(servers), ", ".join(servers) or "none")
    tasks: dict[Any, asyncio.Task[None]] = {}  # by request id
    try:
        while line := await reader.readline():
            try:
                request = json.loads(line)
                rid = request["id"]
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a request that is not one: %.200r", line)
                continue
            if request.get("op") == "cancel":  # the worker gave up: no answer
                if (running := tasks.get(rid)) is not None:
                    running.cancel()  # a call's server is sent notifications/cancelled
                continue
            task = asyncio.create_task(_answer(request, servers, send))
            tasks[rid] = task
            task.add_done_callback(partial(_forget, tasks, rid))
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*(s.aclose() for s in servers.values()), return_exceptions=True)


def _forget(tasks: dict[Any, asyncio.Task[None]], rid: Any, task: asyncio.Task[None]) -> None:
    if tasks.get(rid) is task:
        del tasks[rid]


async def _answer(request: dict[str, Any], servers: dict[str, ServerSession], send: Send) -> None:
    rid = request["id"]
    name = request.get("server")
    try:
        server = servers.get(name) if isinstance(name, str) else None
        if server is None:
            raise McpFailure(f"MCP server {name!r} is not configured")
        match request.get("op"):
            case "list":
                answer: Any = await server.list_tools()
            case "call":
                answer = await server.call_tool(str(request["tool"]), request.get("arguments") or {})
            case other:
                raise McpFailure(f"MCP server {name!r}: unknown request {other!r}")
        await send({"id": rid, "ok": answer})
    except McpFailure as e:
        await send({"id": rid, "error": str(e)})
    except Exception as e:
        log.exception("request %s for MCP server %r failed", rid, name)
        await send({"id": rid, "error": f"MCP server {name!r} failed: {describe(e)}"})


def main() -> None:
    # The protocol gets its own copy of stdout; fd 1 becomes stderr, so that nothing printed
    # by a library can corrupt the pipe.
    stdout = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    # Ctrl-C in a terminal reaches the whole process group: the worker decides when we stop
    # (by closing our stdin), so a warm shutdown keeps its MCP tools to the end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s: %(levelname)s/mcp-host %(process)d] %(message)s")
    for noisy in ("httpx2", "httpcore2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(serve(sys.stdin.buffer, stdout))


if __name__ == "__main__":
    main()
