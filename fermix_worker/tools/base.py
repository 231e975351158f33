"""Tools: what the model may call, with a policy class, and a registry that never raises.

A failing, unknown, malformed or not-permitted call becomes an error *result* for the model
to read. Results of external tools come back inside the ``<untrusted_tool_result>`` fence.
A tool's runner gets the call's :class:`~fermix_worker.tools.context.RunContext` (the calling
turn, the audit recorder, the progress reporter) with its arguments; the registry audits every
call and refusal through that context's recorder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from fermix_shared import audit, tracing
from fermix_shared.errors import FermixError
from fermix_shared.messages import ToolCall
from fermix_worker.interrupt import CallTimedOut, call_with_timeout
from fermix_worker.providers.base import ToolSpec
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.fence import fence
from fermix_worker.tools.policy import PolicyClass, ToolScope

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "MAX_RESULT_CHARS",
    "PolicyClass",
    "RunContext",
    "Tool",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "ToolSource",
]

# Plugins contribute hooks and skills, never tools: a tool is Fermix's own or an MCP server's.
ToolSource = Literal["builtin", "mcp"]

# Tool results longer than this are cut before they go back to the model.
MAX_RESULT_CHARS = 20_000
# Seconds a tool call may run unless its tool sets its own (FERMIX_TOOL_TIMEOUT_SECONDS).
DEFAULT_TOOL_TIMEOUT_S = 120.0
TOOL_TIMED_OUT = (
    "Error: {tool} did not finish within {seconds:g} s and was abandoned. "
    "Try a smaller request, or another way."
)

# Policy classes whose results come from outside Fermix, whoever wrote the tool.
_EXTERNAL_POLICIES: frozenset[PolicyClass] = frozenset({"network", "external_api"})


@dataclass(frozen=True)
class Tool:
    """One capability the model may call: its schema, its runner and its policy class.
    ``run(ctx, arguments)`` gets the call's context and the model's arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[RunContext, dict[str, Any]], str]
    policy: PolicyClass = "read_only"
    # Safe to run again if a worker died while it ran (durable turns re-run only these).
    idempotent: bool = True
    # Set for tools whose success is itself a reply to the user (an emoji reaction, an
    # attachment, a message sent into the chat): a turn that did this and then produced no
    # text closes silently.
    delivers: Literal["reaction", "attachment", "message"] | None = None
    # A fan-out tool (subagents): the loop parks the turn instead of calling ``run``.
    fanout: bool = False
    # Hidden from guests whatever its policy class (it reads the operator's private data).
    operator_only: bool = False
    # Who provides the tool: Fermix itself or an MCP server (whose results are fenced).
    source: ToolSource = "builtin"
    # Wall-clock bound of one call in seconds; None: the registry's default (120 s).
    timeout_s: float | None = None
    # Set when the tool cannot work on this worker (run_command without its sandbox): it is
    # offered to no one, and a call made anyway gets this reason as its error.
    unavailable: str | None = None

    @property
    def external(self) -> bool:
        """True when the result is external content and must be fenced."""
        return self.policy in _EXTERNAL_POLICIES or self.source != "builtin"

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


@dataclass(frozen=True)
class ToolResult:
    content: str
    is_error: bool = False


class ToolError(FermixError):
    """Raised by a tool for a failure whose message the model should see as-is."""


class ToolRegistry:
    """The tools a turn may use. ``scoped`` gives a view narrowed to one caller's scope."""

    def __init__(
        self, tools: Iterable[Tool], scopes: tuple[ToolScope, ...] = (),
        *, timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ):
        self._tools = {t.name: t for t in tools}
        # Every scope must permit a tool for this view to offer it (views nest by narrowing).
        self._scopes = scopes
        self._timeout_s = timeout_s

    def scoped(self, scope: ToolScope) -> ToolRegistry:
        """A view offering only the tools ``scope`` permits; refused calls get an error result."""
        return ToolRegistry(self._tools.values(), (*self._scopes, scope), timeout_s=self._timeout_s)

    def with_variant(self, tool: Tool) -> ToolRegistry:
        """This view with ``tool`` in place of the tool of the same name (a run profile's
        variant of it: /ultra's subagents); a view without that name stays as it is."""
        if tool.name not in self._tools:
            return self
        tools = [tool if t.name == tool.name else t for t in self._tools.values()]
        return ToolRegistry(tools, self._scopes, timeout_s=self._timeout_s)

    def _denial(self, tool: Tool) -> str | None:
        if tool.unavailable is not None:
            return f"Error: {tool.unavailable}"
        for scope in self._scopes:
            reason = scope.denial(tool)
            if reason is not None:
                return reason
        return None

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self._tools.values() if self._denial(t) is None]

    def get(self, name: str) -> Tool | None:
        """The tool called ``name`` if this view offers it."""
        tool = self._tools.get(name)
        return tool if tool is not None and self._denial(tool) is None else None

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult:
        """Run ``call`` with ``ctx``; audited (through ``ctx``'s recorder) as a tool
        invocation whose ``check`` is ``pass`` (one entry per call: the capability check and
        what it let run), or as a failed check when this view refuses the tool. With tracing
        on, the call is a span (its name, duration and outcome; never its arguments or
        result), child of the turn's or subagent's."""
        started = time.perf_counter()
        with tracing.span(f"execute_tool {call.name}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id, "gen_ai.tool.type": "function",
            **tracing.waited_for_approval(call.id),
        }) as span:
            result, outcome = self._execute(call, ctx, started)
            if span.is_recording():
                span.set_attributes({
                    "fermix.tool.outcome": outcome,
                    "fermix.tool.duration_ms": round((time.perf_counter() - started) * 1000, 1),
                })
                if outcome != "ok":
                    span.set_attribute("error.type", f"tool_{outcome}")
                    span.set_status(tracing.StatusCode.ERROR, f"tool call {outcome}")
            return result

    def _execute(self, call: ToolCall, ctx: RunContext,
                 started: float) -> tuple[ToolResult, Literal["ok", "error", "refused"]]:
        tool = self._tools.get(call.name)
        if tool is None:
            result = ToolResult(f"Error: unknown tool {call.name!r}", is_error=True)
        elif (denied := self._denial(tool)) is not None:
            audit_refusal(ctx, call, denied)
            return ToolResult(denied, is_error=True), "refused"
        elif "_unparsed" in call.arguments:
            result = ToolResult("Error: tool arguments were not valid JSON", is_error=True)
        else:
            result = _run(tool, call, ctx, tool.timeout_s or self._timeout_s)
            if tool.external:
                result = ToolResult(fence(tool.name, result.content), result.is_error)
        _audit_call(ctx, call, tool, result, started)
        return result, "error" if result.is_error else "ok"


def _audit_call(ctx: RunContext, call: ToolCall, tool: Tool | None, result: ToolResult,
                started: float) -> None:
    args_sha256, args_len = audit.arguments_digest(call.arguments)
    ctx.audit.record(
        "tool", call.name if tool is not None else "unknown", "error" if result.is_error else "ok",
        check="pass" if tool is not None else "unknown_tool", call_id=call.id[:64],
        ms=round((time.perf_counter() - started) * 1000, 1), args_sha256=args_sha256,
        args_len=args_len)


def audit_refusal(ctx: RunContext, call: ToolCall, reason: str, check: str = "scope") -> None:
    """A refused call, audited (through ``ctx``'s recorder) as a failed capability check:
    ``reason`` is the refusal the model reads (Fermix's own wording, never the arguments)."""
    args_sha256, args_len = audit.arguments_digest(call.arguments)
    ctx.audit.record("check", call.name, "fail", check=check, reason=reason,
                     call_id=call.id[:64], args_sha256=args_sha256, args_len=args_len)


def _run(tool: Tool, call: ToolCall, ctx: RunContext, timeout_s: float) -> ToolResult:
    try:
        out = call_with_timeout(lambda: tool.run(ctx, call.arguments), timeout_s)
    except CallTimedOut:
        return ToolResult(TOOL_TIMED_OUT.format(tool=call.name, seconds=timeout_s), is_error=True)
    except ToolError as e:
        return ToolResult(f"Error: {e}", is_error=True)
    except Exception as e:  # a broken tool must not break the turn
        return ToolResult(f"Error: {call.name} failed: {type(e).__name__}: {e}", is_error=True)
    if not isinstance(out, str):
        out = json.dumps(out, default=str)  # never let an odd return value raise
    if len(out) > MAX_RESULT_CHARS:
        out = out[:MAX_RESULT_CHARS] + "\n[truncated]"
    return ToolResult(out)
