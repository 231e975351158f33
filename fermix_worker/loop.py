"""AgentLoop: a bounded LLM-and-tool loop as a resumable state machine.

The whole state is one versioned, JSON-serializable record,
:class:`~fermix_worker.loop_state.LoopState`. :meth:`AgentLoop.step` advances it by exactly one
unit of work, a model call or one tool call, and returns the next step, a closed set:
:class:`RunAgain`, :class:`Final`, :class:`Failed`, or a park (:class:`AwaitSubagents`,
:class:`AwaitApproval`). The state is checkpointed after every step (and just before a tool
starts), so a turn whose worker died resumes on another worker from where it was: a model call
is re-issued, a tool call that had started but never reported is re-run only if its tool is
idempotent, otherwise the model is told it was interrupted. Nothing here knows Celery, FastAPI
or Redis.

The loop's effects are explicit: its caller hands it a
:class:`~fermix_worker.tools.context.RunContext` (the calling turn, the audit recorder), and
the loop passes it to each tool call with that call's progress reporter. It records nothing
itself and reads no ambient state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, assert_never

from fermix_shared import metrics
from fermix_shared.errors import ProviderError, is_overflow
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.approvals.taint import TAINT_REASON, TAINT_REFUSAL, TaintGate
from fermix_worker.guard import LoopGuard
from fermix_worker.loop_state import REPLY_SEPARATOR, LoopState, interim_texts, turn_text
from fermix_worker.loop_steps import (
    AwaitApproval,
    AwaitSubagents,
    Failed,
    Final,
    LoopOutcome,
    NextStep,
    RunAgain,
)
from fermix_worker.providers.base import ModelRequest, ModelTurn, ProviderState, ToolSpec
from fermix_worker.providers.routing import failure_message
from fermix_worker.tools.base import Tool, ToolResult, audit_refusal
from fermix_worker.tools.context import RunContext

__all__ = [
    "ITERATION_CAP_MESSAGE", "AgentLoop", "AwaitApproval", "AwaitSubagents", "CompletingProvider",
    "Failed", "Final", "LoopEvents", "LoopTools", "LoopOutcome", "NextStep", "RunAgain", "answer_call",
    "denied_message", "interim_texts", "pending_calls", "plan_tool_calls", "turn_text",
]

log = logging.getLogger(__name__)

ITERATION_CAP_MESSAGE = (
    "I hit the investigation step limit before finishing that request. Try narrowing the ask…"
)
INTERRUPTED_TOOL = (
    "Error: this tool call was interrupted before it reported (the worker running it stopped). "
    "It was not run again because it may have side effects; check whether it took effect "
    "before retrying."
)



class LoopEvents(Protocol):
    """Where the loop reports progress (the run's event stream, in production)."""

    def assistant_delta(self, text: str) -> None: ...

    def tool_start(self, call: ToolCall) -> None: ...

    def tool_update(self, call: ToolCall, text: str) -> None: ...

    def tool_result(self, call: ToolCall, result: ToolResult) -> None: ...

    def diagnostic(self, kind: str, **data: Any) -> None: ...

    def thinking(self, text: str) -> None: ...


class CompletingProvider(Protocol):
    """What the loop needs of a provider: the seed's adapter contract, routed
    (:class:`~fermix_worker.providers.base.Provider`: ``chat`` first, then ``continue_`` from
    the state the last call returned, which the loop keeps without reading it)."""

    def chat(self, request: ModelRequest, on_delta: Callable[[str], None]) -> ModelTurn: ...

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: Callable[[str], None]) -> ModelTurn: ...


class LoopTools(Protocol):
    """What the loop needs of its tools (a :class:`~fermix_worker.tools.base.ToolRegistry`
    view in production; the recorder's and a replay's stand-ins wrap one)."""

    def specs(self) -> list[ToolSpec]: ...

    def get(self, name: str) -> Tool | None: ...

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult: ...


def plan_tool_calls(turn: ModelTurn) -> list[ToolCall]:
    """Parse step: the calls to run, in order, with ids made unique. No side effects."""
    seen: set[str] = set()
    plan = []
    for i, call in enumerate(turn.tool_calls):
        call_id = call.id if call.id and call.id not in seen else f"call_{i}"
        seen.add(call_id)
        plan.append(call.model_copy(update={"id": call_id}))
    return plan


def pending_calls(state: LoopState) -> list[ToolCall]:
    """Tool calls of the last assistant message that have no result yet."""
    for i in range(len(state.messages) - 1, state.turn_start - 1, -1):
        msg = state.messages[i]
        if msg.role == "assistant":
            answered = {m.tool_call_id for m in state.messages[i + 1 :] if m.role == "tool"}
            return [c for c in msg.tool_calls if c.id not in answered]
    return []


class AgentLoop:
    def __init__(
        self,
        provider: CompletingProvider,
        tools: LoopTools,
        events: LoopEvents,
        *,
        max_tokens: int = 4096,
        guard: LoopGuard | None = None,
        check: Callable[[], None] = lambda: None,
        inject: Callable[[], list[str]] = list,
        checkpoint: Callable[[LoopState], Any] = lambda state: None,
        hooks: HookRegistry | None = None,
        blocking: Callable[[], AbstractContextManager[None]] = nullcontext,
        needs_approval: Callable[[Tool], bool] = lambda tool: False,
        taint_gate: Callable[[Tool, str | None], TaintGate | None] = lambda tool, source: None,
        context: RunContext | None = None,
    ):
        self._provider = provider
        self._tools = tools
        self._events = events
        self._max_tokens = max_tokens
        self._guard = guard or LoopGuard()
        # Called between steps and on every streamed delta: raises a ControlSignal when the
        # turn must stop (cancelled, or its lease lost).
        self._check = check
        # New user messages to add before the next model call (steer mode).
        self._inject = inject
        self._checkpoint = checkpoint
        self._hooks = hooks or HookRegistry()
        # Around each model call and tool run: work that blocks and that the caller may cut
        # short (a /stop, a deadline) by raising a ControlSignal out of it.
        self._blocking = blocking
        # Whether a call of this tool must wait for a person's approval first.
        self._needs_approval = needs_approval
        # How a call is gated once the turn has read untrusted content (approvals/taint.py).
        self._taint_gate = taint_gate
        # What the tools may use of the run (None: no turn, nothing audited, nobody watching).
        self._context = context or RunContext()
        # Whether the next streamed text must first carry REPLY_SEPARATOR (set per model call).
        self._separate = False

    def _on_delta(self, text: str) -> None:
        self._check()
        if text and self._separate:
            # A later step's text follows the text of an earlier one: the deltas carry the
            # separator the reply has (see :func:`turn_text`), so they add up to it.
            self._separate = False
            self._events.assistant_delta(REPLY_SEPARATOR)
        self._events.assistant_delta(text)

    def step(self, state: LoopState) -> NextStep:
        """One unit of work: the next pending tool call, else one model call."""
        pending = pending_calls(state)
        if pending:
            return self._tool_step(state, pending[0])
        return self._model_step(state)

    def _model_step(self, state: LoopState) -> NextStep:
        if state.iteration >= state.max_iterations:
            return Failed(ITERATION_CAP_MESSAGE, f"{state.max_iterations} iterations")
        if state.pending_warnings:
            # OpenFang: "the guard injects a system message".
            state.messages.append(
                ChatMessage(role="system", content="\n\n".join(state.pending_warnings)))
        state.pending_warnings = []
        state.messages.extend(ChatMessage(role="user", content=t) for t in self._inject())
        request = ModelRequest(
            model=state.model,
            system=state.system,
            messages=state.messages,
            tools=self._tools.specs(),
            max_tokens=self._max_tokens,
            reasoning_effort=state.reasoning_effort,
            temperature=state.temperature,
        )
        if self._hooks.has("llm_input"):
            self._hooks.call("llm_input", {
                "run_id": state.run_id, "model": state.model, "system": state.system,
                "messages": [m.model_dump() for m in state.messages], "iteration": state.iteration,
            })
        self._separate = bool(interim_texts(state))
        try:
            with self._blocking():
                turn = self._call(state, request)
        except ProviderError as e:
            return Failed(failure_message(e), str(e), overflow=is_overflow(e))
        self._count(state, turn)
        plan = plan_tool_calls(turn)
        state.messages.append(ChatMessage(role="assistant", content=turn.content, tool_calls=plan))
        # The provider's transcript now covers every message so far; one whose call ids the
        # plan had to change no longer matches the tool results: the next call re-sends.
        same = [c.id for c in plan] == [c.id for c in turn.tool_calls]
        state.provider_state = turn.provider_state if same else None
        state.provider_seen = len(state.messages)
        if not plan:
            state.final = turn.content
            return Final(turn.content)
        verdict = self._guard.observe(state.guard, plan)
        for warning in verdict.warnings:
            self._events.diagnostic("loop_guard", message=warning)
        if verdict.kill:
            return Failed(verdict.kill)
        state.pending_warnings = list(verdict.warnings)
        return RunAgain()

    def _count(self, state: LoopState, turn: ModelTurn) -> None:
        """Record an answered call: the iteration, the route that answered, usage, reports."""
        state.iteration += 1
        if state.route is None and turn.route:
            state.route, state.answered_model = turn.route, turn.route_model or turn.model or None
        metrics.count_iteration()
        state.usage.input_tokens += turn.input_tokens
        state.last_input_tokens = turn.input_tokens
        state.usage.output_tokens += turn.output_tokens
        self._events.diagnostic(
            "iteration", iteration=state.iteration, model=turn.model,
            inputTokens=turn.input_tokens, outputTokens=turn.output_tokens,
        )
        # OpenFang's structured line (the run id and conversation come from the log context).
        log.info("Agent loop iteration complete: agent=%s iteration=%d tokens=%d", state.agent,
                 state.iteration, turn.input_tokens + turn.output_tokens)
        if turn.thinking:
            self._events.thinking(turn.thinking)

    def _call(self, state: LoopState, request: ModelRequest) -> ModelTurn:
        """The turn's first call (``chat``), else a continuation from the provider's state
        with the messages added since it (tool results, notices, steered messages)."""
        if state.iteration == 0:
            return self._provider.chat(request, self._on_delta)
        news = state.messages[state.provider_seen:] if state.provider_state else []
        return self._provider.continue_(state.provider_state, news, request, self._on_delta)

    def _tool_step(self, state: LoopState, call: ToolCall) -> NextStep:
        self._check()
        tool = self._tools.get(call.name)
        gate = self._taint_gate(tool, state.taint) if tool is not None else None
        if gate == "refuse":
            refused = ToolResult(TAINT_REFUSAL.format(tool=call.name, source=state.taint),
                                 is_error=True)
            audit_refusal(self._context, call, refused.content, "taint")
            self._events.tool_result(call, refused)
            return self._answer(state, call, refused)
        if tool is not None and (gate == "approval" or self._needs_approval(tool)):
            mark = state.approvals.get(call.id)
            # None: ask. "pending": the turn was parked for it and came back without an answer
            # (recovered after a crash, not answered): ask again.
            if mark is None or mark == "pending":
                reason = TAINT_REASON.format(source=state.taint) if gate else ""
                if mark is None and gate:
                    # A passed check that still needs a person: audited with its gate.
                    self._context.audit.record("check", call.name, "pass", check="taint",
                                               gate="approval", source=state.taint,
                                               call_id=call.id[:64])
                state.approvals[call.id] = "pending"
                return AwaitApproval(call, reason)
            if mark != "approved":
                refused = ToolResult(denied_message(mark), is_error=True)
                self._events.tool_result(call, refused)
                return self._answer(state, call, refused)
        if tool is not None and tool.fanout and state.journal.get(call.id) != "started":
            state.journal[call.id] = "started"
            return AwaitSubagents(call)
        if state.journal.get(call.id) == "started" and not (tool and tool.idempotent):
            # It started on a worker that died and may have had effects: never run it twice.
            result = ToolResult(INTERRUPTED_TOOL, is_error=True)
            self._events.tool_result(call, result)
        else:
            state.journal[call.id] = "started"
            self._checkpoint(state)
            self._events.tool_start(call)
            result = self._execute(state, call)
            if tool is not None and tool.external and state.taint is None:
                state.taint = call.name  # its result was fenced: untrusted from here on
            self._events.tool_result(call, result)
            if tool is not None and tool.delivers and not result.is_error:
                state.side_effects.append(tool.delivers)
        return self._answer(state, call, result)

    def _answer(self, state: LoopState, call: ToolCall, result: ToolResult) -> NextStep:
        """Record ``result`` as the call's answer (through the persist hook)."""
        if self._hooks.has("tool_result_persist"):
            out = self._hooks.call("tool_result_persist", {
                "run_id": state.run_id, "tool": call.name, "callId": call.id,
                "content": result.content, "isError": result.is_error,
            })
            result = ToolResult(str(out.get("content", result.content)), result.is_error)
        if result.is_error:
            state.tool_failures.append(f"{call.name}: {result.content.removeprefix('Error: ')}")
        state.messages.append(
            ChatMessage(
                role="tool", content=result.content, tool_call_id=call.id,
                tool_name=call.name, is_error=result.is_error,
            )
        )
        state.journal[call.id] = "done"
        return RunAgain()

    def _execute(self, state: LoopState, call: ToolCall) -> ToolResult:
        """Run one tool call through the before/after hooks, timed."""
        if self._hooks.has("before_tool_call"):
            out = self._hooks.call("before_tool_call", {
                "run_id": state.run_id, "tool": call.name, "callId": call.id,
                "arguments": call.arguments,
            })
            if out.get("block"):
                reason = out["block"] if isinstance(out["block"], str) else "by policy"
                audit_refusal(self._context, call, f"blocked by a before_tool_call hook: {reason}",
                              "hook")
                return ToolResult(f"Error: this tool call was blocked: {reason}", is_error=True)
            call = call.model_copy(update={"arguments": out.get("arguments", call.arguments)})
        label = call.name if self._tools.get(call.name) else "unknown"
        ctx = self._context.for_call(lambda text: self._events.tool_update(call, text))
        with metrics.time_tool(label) as timing, self._blocking():
            result = self._tools.execute(call, ctx)
            timing.outcome = "error" if result.is_error else "ok"
        if self._hooks.has("after_tool_call"):
            self._hooks.call("after_tool_call", {
                "run_id": state.run_id, "tool": call.name, "callId": call.id,
                "isError": result.is_error, "content": result.content,
            })
        return result

    def run(self, state: LoopState) -> LoopOutcome:
        """Step until the turn ends, checkpointing after every step."""
        if state.final is not None:
            return Final(state.final)
        while True:
            self._check()
            nxt = self.step(state)
            self._checkpoint(state)
            match nxt:
                case RunAgain():
                    continue
                case Final() | Failed() | AwaitSubagents() | AwaitApproval():
                    return nxt
                case _:
                    assert_never(nxt)


def answer_call(state: LoopState, call_id: str, result: ToolResult) -> None:
    """Record ``result`` as the answer to the pending call ``call_id`` (a fan-out's merged
    results, handed back by its callback)."""
    call = next(c for c in pending_calls(state) if c.id == call_id)
    if result.is_error:
        state.tool_failures.append(f"{call.name}: {result.content.removeprefix('Error: ')}")
    state.messages.append(ChatMessage(
        role="tool", content=result.content, tool_call_id=call.id, tool_name=call.name,
        is_error=result.is_error,
    ))
    state.journal[call.id] = "done"


def denied_message(mark: str) -> str:
    """The tool result of a call that was not approved (``mark``: "denied: <why>")."""
    why = mark.removeprefix("denied:").strip() or "denied"
    return (f"Error: this call was not approved ({why}), so it did not run. Do not retry it "
            "unless the user asks; say what you would have done instead.")
