"""MCP servers' tools as Fermix tools, for the turns and subagents of one worker process.

Each enabled server is listed on first use in the process (through the host process,
fermix_worker/mcp/bridge.py) and the listing is kept; it is taken again when the server has
reconnected or said its tools changed. Turns wait for a listing until ``LISTING_WAIT_S``
after it started, then go on without it; a server that cannot be listed is left out, with a
warning, and tried again after ``RELIST_AFTER_S``. The process's tool registry asks for the tools once per turn
(:class:`ToolsWithMcp`), so a server that comes up later is there from the next turn on.

Names are ``<server>__<tool>`` within the providers' rule ``^[a-zA-Z0-9_-]{1,64}$``; input
schemas go to the model as the server gave them. Results come back fenced (``source="mcp"``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fermix_shared.mcp_config import TOOL_SEPARATOR, McpServerConfig
from fermix_shared.messages import ToolCall
from fermix_worker.mcp.bridge import McpHost, McpUnavailable, Reply
from fermix_worker.mcp.wire import CallResult, ListedTool, ListResult
from fermix_worker.providers.base import ToolSpec
from fermix_worker.tools.base import (
    DEFAULT_TOOL_TIMEOUT_S,
    Tool,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.policy import ToolScope

log = logging.getLogger(__name__)

# Seconds after a listing started that turns wait for it before they go on without the
# server's tools (which join a later turn). Starting a server through npx can take longer.
LISTING_WAIT_S = 10.0
# Seconds before a server that could not be listed is tried again.
RELIST_AFTER_S = 30.0
# The host enforces each server's timeout; the worker waits this much longer before it takes
# the host itself for wedged, and the tool registry's own bound is later still.
HOST_GRACE_S = 5.0

MAX_NAME = 64
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def tool_names(server: str, tools: Iterable[str]) -> dict[str, str]:
    """``{name the model sees: the server's name}`` for one server's tools: sanitized,
    namespaced, at most 64 characters and unique (a hash suffix settles clashes)."""
    out: dict[str, str] = {}
    for tool in tools:
        name = _UNSAFE.sub("_", f"{server}{TOOL_SEPARATOR}{tool}")
        if len(name) > MAX_NAME or name in out:
            digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
            name = f"{name[:MAX_NAME - 9]}_{digest}"
        if name in out:
            log.warning("MCP server %r: tool %r clashes with %r after renaming; left out",
                        server, tool, out[name])
            continue
        out[name] = tool
    return out


@dataclass
class _Listing:
    tools: list[Tool] = field(default_factory=list)
    generation: str = ""  # the host's generation the tools are from
    stale: bool = True
    pending: Reply | None = None
    # time.monotonic() until which turns wait for the pending listing (then go on without it)
    wait_until: float = 0.0
    failed_at: float | None = None  # time.monotonic() of the last failure

    def due(self, now: float) -> bool:
        return self.pending is None and self.stale and (
            self.failed_at is None or now - self.failed_at >= RELIST_AFTER_S)


class McpTools:
    """The tools of every enabled MCP server, as this process knows them now."""

    def __init__(self, servers: Sequence[McpServerConfig], host: McpHost | None = None):
        self._servers = {s.name: s for s in servers if s.enabled}
        self.host = host or McpHost(list(self._servers.values()))
        self._listings = {name: _Listing() for name in self._servers}
        self._lock = threading.Lock()

    def tools(self, wait: bool = True) -> list[Tool]:
        """Every MCP tool known now. Starts the listings that are due and waits for those in
        progress, each until ``LISTING_WAIT_S`` after it started: a server slow to start
        delays the turns of that moment by that much at most, not every turn until it is up."""
        now = time.monotonic()
        with self._lock:
            for name, listing in self._listings.items():
                if listing.due(now):
                    try:
                        listing.pending = self.host.submit("list", name)
                        listing.wait_until = now + LISTING_WAIT_S
                    except McpUnavailable as e:
                        self._failed(listing, str(e))
            waiting = [(ls.pending, ls.wait_until) for ls in self._listings.values()
                       if ls.pending is not None]
        for reply, until in waiting if wait else ():
            reply.wait(max(0.0, until - time.monotonic()))
        with self._lock:
            for name, listing in self._listings.items():
                if listing.pending is not None and listing.pending.done():
                    self._absorb(name, listing, listing.pending)
            return [t for listing in self._listings.values() for t in listing.tools]

    def close(self) -> None:
        self.host.close()

    def _absorb(self, name: str, listing: _Listing, reply: Reply) -> None:
        listing.pending = None
        self.host.forget(reply)
        try:
            result = cast(ListResult, reply.result())
        except McpUnavailable as e:
            self._failed(listing, str(e))
            return
        listing.tools = tools_from_listing(self._servers[name], result["tools"], self.call)
        listing.generation = result["generation"]
        listing.stale = False
        listing.failed_at = None
        log.info("MCP server %r: %d tool(s)", name, len(listing.tools))

    def _failed(self, listing: _Listing, error: str) -> None:
        listing.tools = []
        listing.failed_at = time.monotonic()
        log.warning("%s; its tools are left out, trying again in %g s", error, RELIST_AFTER_S)

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> str:
        """Call ``tool`` (the server's own name for it); ToolError for the model on failure."""
        config = self._servers[server]
        try:
            result = cast(CallResult, self.host.request(
                "call", server, config.timeout_seconds + HOST_GRACE_S,
                tool=tool, arguments=arguments))
        except McpUnavailable as e:
            raise ToolError(str(e)) from None
        with self._lock:
            listing = self._listings[server]
            if result["generation"] != listing.generation:
                listing.stale = True  # reconnected, or its tools changed: list it again
        if result["is_error"]:
            raise ToolError(f"MCP server {server!r}: {tool} failed: {result['text']}")
        return result["text"]


# call(server, the server's tool name, arguments) -> the result's text
CallFn = Callable[[str, str, dict[str, Any]], str]


def tools_from_listing(server: McpServerConfig, listed: list[ListedTool],
                       call: CallFn) -> list[Tool]:
    """One server's listing as Tools: namespaced names, the server's policy class and trust,
    the input schemas as given, external results (``source="mcp"``: fenced)."""
    by_name = {t["name"]: t for t in listed}
    return [
        Tool(
            name=name,
            description=by_name[original]["description"],
            parameters=_schema(by_name[original]["input_schema"]),
            run=_runner(call, server.name, original),
            policy=server.policy,
            idempotent=by_name[original]["idempotent"],
            operator_only=server.trust == "operator",
            source="mcp",
            timeout_s=server.timeout_seconds + 2 * HOST_GRACE_S,
        )
        for name, original in tool_names(server.name, by_name).items()
    ]


def _runner(call: CallFn, server: str,
            tool: str) -> Callable[[RunContext, dict[str, Any]], str]:
    # An MCP server is called with the arguments alone: nothing of the run goes to it.
    return lambda ctx, arguments: call(server, tool, arguments)


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    # As given; only a schema that is not an object schema at all gets the empty one.
    return schema if schema.get("type") == "object" else {"type": "object", "properties": {}}


class ToolsWithMcp(ToolRegistry):
    """A process's registry plus the MCP tools known when it is asked. A turn's scoped view
    is a snapshot: MCP tools listed later join from the next turn on."""

    def __init__(self, tools: Iterable[Tool], mcp: McpTools, *,
                 timeout_s: float = DEFAULT_TOOL_TIMEOUT_S):
        self._own = list(tools)
        self._mcp = mcp
        super().__init__(self._own, timeout_s=timeout_s)

    def _now(self) -> ToolRegistry:
        # Fermix's own tools win a name clash (MCP names always hold "__").
        return ToolRegistry([*self._mcp.tools(), *self._own], self._scopes,
                            timeout_s=self._timeout_s)

    def scoped(self, scope: ToolScope) -> ToolRegistry:
        return self._now().scoped(scope)

    def specs(self) -> list[ToolSpec]:
        return self._now().specs()

    def get(self, name: str) -> Tool | None:
        return self._now().get(name)

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult:
        return self._now().execute(call, ctx)


class LiveTools:
    """Fermix's own tools and the MCP tools known now, afresh each time it is iterated (for a
    registry built per job, such as a subagent's)."""

    def __init__(self, tools: Iterable[Tool], servers: Sequence[McpServerConfig]):
        self._own = list(tools)
        self._servers = [s for s in servers if s.enabled]

    def __iter__(self) -> Iterator[Tool]:
        if self._servers:
            yield from process_mcp_tools(self._servers).tools()
        yield from self._own


_process_lock = threading.Lock()
# (pid, the servers as JSON) -> McpTools: a forked child makes its own, never sharing its
# parent's host process.
_process: dict[tuple[int, str], McpTools] = {}


def process_mcp_tools(servers: Sequence[McpServerConfig]) -> McpTools:
    """This process's McpTools for ``servers`` (one host process for the turns and the
    subagents alike)."""
    key = (os.getpid(), json.dumps([s.model_dump(mode="json") for s in servers]))
    with _process_lock:
        if key not in _process:
            _process[key] = McpTools(servers)
        return _process[key]


def with_mcp_tools(servers: Sequence[McpServerConfig], tools: Iterable[Tool], *,
                   timeout_s: float = DEFAULT_TOOL_TIMEOUT_S) -> ToolRegistry:
    """The process's tool registry: ``tools``, plus the tools of the enabled MCP servers."""
    enabled = [s for s in servers if s.enabled]
    if not enabled:
        return ToolRegistry(tools, timeout_s=timeout_s)
    return ToolsWithMcp(tools, process_mcp_tools(enabled), timeout_s=timeout_s)
