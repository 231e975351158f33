"""One MCP server's session inside the host process (asyncio, the official ``mcp`` SDK).

The session is opened on first use and shared by every call in flight. It is lost when the
server goes away: a stdio child that exits ends its stdout (noticed at once); an HTTP server
that cannot be reached breaks the transport (noticed by the next request, or by a heartbeat
ping while a call runs long). Calls in flight then fail with the reason, not after their
timeout, and the next call opens a new session, starting a new child. Each request, opening
the session included, is bounded by the server's ``timeout_seconds``; a call that times out
is followed by a ping, and a server that does not answer that either is restarted.

Failures are :class:`McpFailure` whose message is written for the model ("MCP server 'x' ...").
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.shared.session import RequestResponder

from fermix_shared.errors import FermixError
from fermix_shared.mcp_config import McpServerConfig, expand_env
from fermix_worker.mcp.content import render_result
from fermix_worker.mcp.wire import CallResult, ListedTool, ListResult

log = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_INFO = types.Implementation(name="fermix", version="1")
# After a call timed out: seconds a ping may take before the server is taken for hung.
PING_TIMEOUT_S = 5.0
# One HTTP server's connections: every call in flight holds one (a worker runs 100 turns at
# once by default; httpx's own default is 100 in all).
HTTP_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=32)
# Seconds between heartbeat pings while a call to an HTTP server runs.
HEARTBEAT_S = 3.0
# The SDK's error for a request the HTTP server refused for an unknown session (404).
SESSION_TERMINATED = "Session terminated"
# Pages of tools/list a server may answer with (a cursor that never ends is refused).
MAX_LIST_PAGES = 50
# Seconds a session gets to close cleanly (stdio: the SDK then terminates the child).
CLOSE_TIMEOUT_S = 5.0

Incoming = SessionMessage | Exception


class McpFailure(FermixError):
    """A listing or a call failed; ``str(e)`` is the model's error ("MCP server 'x' ...")."""


class _SessionEnded(FermixError):
    """The server refused a request for a session it does not know (HTTP 404)."""


def describe(e: BaseException) -> str:
    """A short reason: the first leaf of an exception group, its type and message."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, McpError):
        return e.error.message
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@dataclass(eq=False)
class _Connection:
    session: ClientSession
    # Resolved with the reason when the connection is lost; setting `close` tears it down.
    gone: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    close: asyncio.Event = field(default_factory=asyncio.Event)
    heartbeat: bool = False  # a heartbeat ping is in flight

    def lose(self, reason: str) -> None:
        if not self.gone.done():
            self.gone.set_result(reason)
        self.close.set()


class ServerSession:
    """The session to one server; coroutines run on the host's event loop."""

    def __init__(self, config: McpServerConfig, environ: Mapping[str, str]):
        self.config = config
        self._environ = environ
        self._label = f"MCP server {config.name!r}"
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._holders: set[asyncio.Task[None]] = set()
        self._probes: set[asyncio.Task[None]] = set()
        # Bumped by every new connection and every tools/list_changed notification.
        self.generation = 0

    async def list_tools(self) -> ListResult:
        tools: list[ListedTool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._request(partial(ClientSession.list_tools, params=params),
                                       "tools/list")
            tools += [_listed(t) for t in page.tools]
            cursor = page.nextCursor
            if not cursor:
                return {"tools": tools, "generation": self.generation_tag()}
        raise McpFailure(f"{self._label} listed more than {MAX_LIST_PAGES} pages of tools")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallResult:
        result = await self._request(lambda s: s.call_tool(name, arguments),
                                     f"the call to {name!r}")
        return {"text": render_result(result), "is_error": result.isError,
                "generation": self.generation_tag()}

    def generation_tag(self) -> str:
        """Changes when the server reconnects or its tools change, in this host process or a
        new one (so a worker's listing from an earlier host counts as old)."""
        return f"{os.getpid()}:{self.generation}"

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.lose("the host is shutting down")
        if self._holders:
            _, slow = await asyncio.wait(self._holders, timeout=CLOSE_TIMEOUT_S)
            for task in slow:
                task.cancel()

    # -- connection ---------------------------------------------------------------------

    async def _connection(self) -> _Connection:
        if self._conn is not None and not self._conn.gone.done():
            return self._conn
        if self._connecting is None:
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(self._connected)
        # Shielded: a caller that gives up must not cancel the start others wait for.
        return await asyncio.shield(self._connecting)

    def _connected(self, task: asyncio.Task[_Connection]) -> None:
        self._connecting = None
        if not task.cancelled() and task.exception() is None:
            self._conn = task.result()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[_Connection] = loop.create_future()
        holder = asyncio.create_task(self._hold(ready))
        self._holders.add(holder)
        holder.add_done_callback(self._holders.discard)
        timeout = self.config.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(ready)
        except TimeoutError:
            ready.cancel()
            holder.cancel()
            raise McpFailure(f"{self._label} did not start within {timeout:g} s") from None

    async def _hold(self, ready: asyncio.Future[_Connection]) -> None:
        """Open the session, hand it over through ``ready``, keep it open until it is lost
        or closed. The SDK's contexts must be entered and left by one task: this one."""
        conn: _Connection | None = None
        reason = "it closed the connection"
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                relay_tx, relay_rx = anyio.create_memory_object_stream[Incoming](0)
                relays = await stack.enter_async_context(anyio.create_task_group())
                session = await stack.enter_async_context(ClientSession(
                    relay_rx, write, message_handler=self._on_message, client_info=CLIENT_INFO))
                relays.start_soon(self._relay, read, relay_tx, lambda: conn)
                await session.initialize()
                self.generation += 1
                conn = _Connection(session)
                if ready.done():  # the start timed out meanwhile
                    return
                ready.set_result(conn)
                log.info("%s: session open (%s)", self._label, self.config.transport)
                await conn.close.wait()
                relays.cancel_scope.cancel()
        except Exception as e:
            reason = describe(e)
            if not ready.done():
                ready.set_exception(McpFailure(f"{self._label} could not be started: {reason}"))
            elif conn is not None and not conn.gone.done():
                log.warning("%s: connection lost: %s", self._label, reason)
        finally:
            if conn is not None:
                conn.lose(reason)

    async def _relay(self, source: MemoryObjectReceiveStream[Incoming],
                     sink: MemoryObjectSendStream[Incoming],
                     conn: Callable[[], _Connection | None]) -> None:
        """Pass the server's messages to the session, and notice when they end: a stdio child
        that exited, a closed stream. (The SDK would only tell the calls in flight.)"""
        try:
            async with sink:
                async for message in source:
                    await sink.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        current = conn()
        if current is not None and not current.gone.done():
            log.warning("%s: the server closed the connection", self._label)
            current.lose("the server closed the connection")

    async def _on_message(
        self, message: RequestResponder[types.ServerRequest, types.ClientResult]
        | types.ServerNotification | Exception,
    ) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root, types.ToolListChangedNotification):
            self.generation += 1  # workers list the tools again
        elif isinstance(message, Exception):
            log.warning("%s sent something unreadable: %s", self._label, describe(message))

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Incoming],
                                                      MemoryObjectSendStream[SessionMessage]]]:
        cfg = self.config
        if cfg.command is not None:
            env = {k: expand_env(v, self._environ, f"env {k}") for k, v in cfg.env.items()}
            params = StdioServerParameters(command=cfg.command, args=cfg.args, env=env or None,
                                           cwd=cfg.cwd)
            async with stdio_client(params, errlog=sys.stderr) as (read, write):
                yield read, write
            return
        assert cfg.url is not None
        headers = {k: expand_env(v, self._environ, f"header {k}") for k, v in cfg.headers.items()}
        timeout = httpx.Timeout(cfg.timeout_seconds, read=max(cfg.timeout_seconds, 300.0))
        async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=HTTP_LIMITS,
                                     follow_redirects=True) as client, \
                streamable_http_client(cfg.url, http_client=client) as (read, write, _):
            yield read, write

    # -- calls --------------------------------------------------------------------------

    async def _request(self, send: Callable[[ClientSession], Awaitable[T]], what: str) -> T:
        """``send`` on the session (opened if need be), the whole within the server's timeout
        (the worker counts on it). A session the server no longer knows (an HTTP server that
        restarted between calls: the request was refused unseen) is replaced and the request
        sent once more."""
        timeout = self.config.timeout_seconds
        deadline = asyncio.get_running_loop().time() + timeout
        for _ in range(2):
            try:
                async with asyncio.timeout_at(deadline):
                    conn = await self._connection()
            except TimeoutError:
                raise McpFailure(f"{self._label} did not start within {timeout:g} s") from None
            try:
                return await self._bounded(conn, send(conn.session), what, deadline)
            except _SessionEnded:
                continue
        raise McpFailure(f"{self._label} ended its session twice in a row during {what}")

    async def _bounded(self, conn: _Connection, request: Awaitable[T], what: str,
                       deadline: float) -> T:
        """``request``'s result, or McpFailure when the server fails it, breaks off, or does
        not answer by ``deadline`` (the loop's clock)."""
        task = asyncio.ensure_future(request)
        timeout = self.config.timeout_seconds
        loop = asyncio.get_running_loop()
        done: set[asyncio.Future[Any]] = set()
        try:
            either: set[asyncio.Future[Any]] = {task, conn.gone}
            while not done and (left := deadline - loop.time()) > 0:
                done, _ = await asyncio.wait(either, timeout=min(left, HEARTBEAT_S),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done and self.config.url is not None:
                    self._background(self._heartbeat(conn))
        finally:
            if not task.done():
                task.cancel()
        if task in done:
            if task.cancelled():  # not by us: we cancel only what is not done
                conn.lose("a request was cancelled under it")
                raise McpFailure(f"{self._label} dropped {what}; it is restarted on the next call")
            try:
                return task.result()
            except McpError as e:
                if e.error.message == SESSION_TERMINATED:
                    conn.lose("the server ended the session")
                    raise _SessionEnded from None
                if e.error.code == types.CONNECTION_CLOSED:
                    conn.lose("it closed the connection")
                    raise McpFailure(f"{self._label} closed the connection during {what}; "
                                     "it is restarted on the next call") from None
                raise McpFailure(f"{self._label} refused {what}: {e.error.message}") from None
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                conn.lose("its connection was closed")
                raise McpFailure(f"{self._label} was not connected; "
                                 "it is restarted on the next call") from None
            except Exception as e:  # a misbehaving server: invalid answers and the like
                raise McpFailure(f"{self._label} failed {what}: {describe(e)}") from None
        if conn.gone.done():
            raise McpFailure(f"{self._label} went away during {what} ({conn.gone.result()}); "
                             "it is restarted on the next call")
        self._background(self._probe(conn))
        raise McpFailure(f"{self._label} did not answer {what} within {timeout:g} s")

    def _background(self, probe: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(probe)
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _heartbeat(self, conn: _Connection) -> None:
        """While a call to an HTTP server runs long: the SDK does not tell a call that the
        server went away mid-answer, but a ping that cannot connect breaks the transport (and
        so ends the call at once). A ping that is merely slow proves nothing: ignored."""
        if conn.heartbeat:
            return
        conn.heartbeat = True
        try:
            async with asyncio.timeout(HEARTBEAT_S):
                await conn.session.send_ping()
        except Exception:
            pass
        finally:
            conn.heartbeat = False

    async def _probe(self, conn: _Connection) -> None:
        """After a timeout: a server that does not answer a ping either is hung; restart it."""
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                await conn.session.send_ping()
        except Exception as e:
            log.warning("%s does not answer a ping (%s); restarting it", self._label, describe(e))
            conn.lose("it stopped answering")


def _listed(tool: types.Tool) -> ListedTool:
    hints = tool.annotations
    return {
        "name": tool.name,
        "description": tool.description or tool.title or "",
        "input_schema": dict(tool.inputSchema),
        "idempotent": bool(hints and (hints.idempotentHint or hints.readOnlyHint)),
    }
