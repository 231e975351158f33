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

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

from fermix_shared import metrics
from fermix_shared.errors import ProviderError, is_overflow
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.guard import LoopGuard
from fermix_worker.loop_state import LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn
from fermix_worker.providers.routing import failure_message
from fermix_worker.tools.base import Tool, ToolRegistry, ToolResult, audit_refusal
from fermix_worker.tools.context import RunContext

ITERATION_CAP_MESSAGE = (
    "I hit the investigation step limit before finishing that request. Try narrowing the ask…"
)
INTERRUPTED_TOOL = (
    "Error: this tool call was interrupted before it reported (the worker running it stopped). "
    "It was not run again because it may have side effects; check whether it took effect "
    "before retrying."
)


@dataclass(frozen=True)
class RunAgain:
    """More work: call the model, or run the next tool call."""


@dataclass(frozen=True)
class Final:
    """The model answered without asking for tools."""

    text: str


@dataclass(frozen=True)
class Failed:
    """The turn cannot finish; ``message`` is what the user is told."""

    message: str
    detail: str = ""
    # The prompt no longer fits the context window: the runner may compact and retry.
    overflow: bool = False


@dataclass(frozen=True)
class AwaitSubagents:
    """The model called a fan-out tool: the turn checkpoints and parks (its worker is given
    back) until the fan-out's results arrive as this call's tool result."""

    call: ToolCall


@dataclass(frozen=True)
class AwaitApproval:
    """The model called a tool that needs a person's approval: the turn checkpoints and parks
    (its worker is given back) until the answer comes, or the wait times out (denied)."""

    call: ToolCall


NextStep = RunAgain | Final | Failed | AwaitSubagents | AwaitApproval
# What a run of the loop ends in: an answer, a failure, or a park (fan-out, approval).
LoopOutcome = Final | Failed | AwaitSubagents | AwaitApproval


class LoopEvents(Protocol):
    """Where the loop reports progress (the run's event stream, in production)."""

    def assistant_delta(self, text: str) -> None: ...

    def tool_start(self, call: ToolCall) -> None: ...

    def tool_update(self, call: ToolCall, text: str) -> None: ...

    def tool_result(self, call: ToolCall, result: ToolResult) -> None: ...

    def diagnostic(self, kind: str, **data: Any) -> None: ...

    def thinking(self, text: str) -> None: ...


class CompletingProvider(Protocol):
    """What the loop needs of a provider: the routed ``complete`` (initial call or not)."""

    def complete(
        self, request: ModelRequest, on_delta: Callable[[str], None], *, initial: bool
    ) -> ModelTurn: ...


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
        tools: ToolRegistry,
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
        # What the tools may use of the run (None: no turn, nothing audited, nobody watching).
        self._context = context or RunContext()

    def _on_delta(self, text: str) -> None:
        self._check()
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
        if state.pending_warnings and state.messages[-1].role == "tool":
            last = state.messages[-1]
            note = "\n\n".join(f"[{w}]" for w in state.pending_warnings)
            state.messages[-1] = last.model_copy(update={"content": f"{last.content}\n\n{note}"})
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
        try:
            with self._blocking():
                turn = self._provider.complete(request, self._on_delta, initial=state.iteration == 0)
        except ProviderError as e:
            return Failed(failure_message(e), str(e), overflow=is_overflow(e))
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
        if turn.thinking:
            self._events.thinking(turn.thinking)
        plan = plan_tool_calls(turn)
        state.messages.append(ChatMessage(role="assistant", content=turn.content, tool_calls=plan,
                                          reasoning=turn.reasoning))
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

    def _tool_step(self, state: LoopState, call: ToolCall) -> NextStep:
        self._check()
        tool = self._tools.get(call.name)
        if tool is not None and self._needs_approval(tool):
            mark = state.approvals.get(call.id)
            # None: ask. "pending": the turn was parked for it and came back without an answer
            # (recovered after a crash, not answered): ask again.
            if mark is None or mark == "pending":
                state.approvals[call.id] = "pending"
                return AwaitApproval(call)
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
