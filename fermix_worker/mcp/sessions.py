"""One MCP server's session inside the host process (asyncio, the official ``mcp`` SDK).

The session is opened on first use and shared by every call in flight. It is lost when the
server goes away: a stdio child that exits ends its stdout (noticed at once); an HTTP server
that dies breaks the response streams of the calls in flight (the SDK fails them at once), or
the transport (noticed by the next request). Calls in flight then fail with the reason, not
after their timeout, and the next call opens a new session, starting a new child. Each
request, opening the session included, is bounded by the server's ``timeout_seconds``; a
request given up (its deadline passed, or the worker stopped waiting) is cancelled, and the
SDK tells the server so (``notifications/cancelled``: it can stop the tool). A call that timed
out is followed by a ping, and a server that does not answer that either is restarted.

Failures are :class:`McpFailure` whose message is written for the model ("MCP server 'x' ...").
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterable, Awaitable, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectSendStream
from mcp import ClientSession, MCPError, StdioServerParameters, types
from mcp.client import IncomingMessage, Transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

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
# once by default; httpx2's own default is 100 in all).
HTTP_LIMITS = httpx2.Limits(max_connections=256, max_keepalive_connections=32)
# The header of the session an HTTP server gave us; a 404 to a request carrying it means the
# server no longer knows the session (the spec's rule; the SDK passes on the server's error, in
# words of the server's choosing, so the status is read off the response).
SESSION_HEADER = "mcp-session-id"
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
    if isinstance(e, MCPError):
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
    # Set when an HTTP server answered 404 for this session: it no longer knows it.
    unknown: asyncio.Event = field(default_factory=asyncio.Event)

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
            cursor = page.next_cursor
            if not cursor:
                return {"tools": tools, "generation": self.generation_tag()}
        raise McpFailure(f"{self._label} listed more than {MAX_LIST_PAGES} pages of tools")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallResult:
        result = await self._request(lambda s: s.call_tool(name, arguments),
                                     f"the call to {name!r}")
        return {"text": render_result(result), "is_error": result.is_error,
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
        unknown = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(
                    await self._transport(stack, unknown))
                relay_tx, relay_rx = anyio.create_memory_object_stream[Incoming](0)
                relays = await stack.enter_async_context(anyio.create_task_group())
                session = await stack.enter_async_context(ClientSession(
                    relay_rx, write, message_handler=self._on_message, client_info=CLIENT_INFO))
                relays.start_soon(self._relay, read, relay_tx, lambda: conn)
                await session.initialize()
                self.generation += 1
                conn = _Connection(session, unknown=unknown)
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

    async def _relay(self, source: AsyncIterable[Incoming], sink: MemoryObjectSendStream[Incoming],
                     conn: Callable[[], _Connection | None]) -> None:
        """Pass the server's messages to the session, and notice when they end: a stdio child
        that exited, a closed stream. (The SDK would only tell the calls in flight.) The
        connection is marked lost before the session hears of the end, so that a call in
        flight is told the server went away, not that its request failed."""
        try:
            async for message in source:
                await sink.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            current = conn()
            if current is not None and not current.gone.done():
                log.warning("%s: the server closed the connection", self._label)
                current.lose("the server closed the connection")
            sink.close()

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.generation += 1  # workers list the tools again
        elif isinstance(message, Exception):
            log.warning("%s sent something unreadable: %s", self._label, describe(message))

    async def _transport(self, stack: AsyncExitStack, unknown: asyncio.Event) -> Transport:
        """The SDK's transport for this server (an HTTP server's client entered in ``stack``;
        ``unknown`` is set when the server answers 404 for our session)."""
        cfg = self.config
        if cfg.command is not None:
            env = {k: expand_env(v, self._environ, f"env {k}") for k, v in cfg.env.items()}
            params = StdioServerParameters(command=cfg.command, args=cfg.args, env=env or None,
                                           cwd=cfg.cwd)
            return stdio_client(params, errlog=sys.stderr)
        assert cfg.url is not None
        headers = {k: expand_env(v, self._environ, f"header {k}") for k, v in cfg.headers.items()}
        timeout = httpx2.Timeout(cfg.timeout_seconds, read=max(cfg.timeout_seconds, 300.0))
        # Redirects: the SDK follows those that stay on the server's origin, whatever the
        # client's own setting says.
        async def on_response(response: httpx2.Response) -> None:
            if response.status_code == 404 and SESSION_HEADER in response.request.headers:
                unknown.set()

        client = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=timeout, limits=HTTP_LIMITS,
            event_hooks={"response": [on_response]}))
        return streamable_http_client(cfg.url, http_client=client)

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
        not answer by ``deadline`` (the loop's clock). A request left unanswered (the deadline,
        the connection lost, or this coroutine cancelled: the worker gave up) is cancelled,
        and the SDK sends the server ``notifications/cancelled`` for it as it unwinds."""
        task = asyncio.ensure_future(request)
        timeout = self.config.timeout_seconds
        left = deadline - asyncio.get_running_loop().time()
        either: set[asyncio.Future[Any]] = {task, conn.gone}
        try:
            done, _ = await asyncio.wait(either, timeout=max(left, 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task in done:
            if task.cancelled():  # not by us: we cancel only what is not done
                conn.lose("a request was cancelled under it")
                raise McpFailure(f"{self._label} dropped {what}; it is restarted on the next call")
            try:
                return task.result()
            except MCPError as e:
                if conn.unknown.is_set():
                    conn.lose("the server ended the session")
                    raise _SessionEnded from None
                if e.error.code == types.CONNECTION_CLOSED:
                    # The connection ended, or (HTTP) this call's response stream did.
                    reason = f"the connection closed: {e.error.message}"
                    conn.lose(reason)
                    raise McpFailure(f"{self._label} went away during {what} ({reason}); "
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
        "input_schema": dict(tool.input_schema),
        "idempotent": bool(hints and (hints.idempotent_hint or hints.read_only_hint)),
    }
