"""AgentLoop: a bounded LLM-and-tool loop as a resumable state machine.

The whole state is one versioned, JSON-serializable :class:`LoopState`; :meth:`AgentLoop.step`
advances it by one model call (and the tools it asked for) and returns the next step, a closed
set: :class:`RunAgain`, :class:`Final` or :class:`Failed`. The caller checkpoints the state
after every step. Nothing here knows Celery, FastAPI or Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

from pydantic import BaseModel, Field, field_validator

from fermix_shared.errors import ProviderError, ProviderRateLimited, ProviderUnavailable
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.providers.base import ModelRequest, ModelTurn, Provider
from fermix_worker.tools.base import ToolRegistry, ToolResult

SCHEMA_VERSION = 1

ITERATION_CAP_MESSAGE = (
    "I hit the investigation step limit before finishing that request. Try narrowing the ask…"
)
DEFAULT_MAX_ITERATIONS = 100


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0


class LoopState(BaseModel):
    """Everything needed to continue a turn on any worker."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    model: str
    system: str
    messages: list[ChatMessage]
    # messages[turn_start:] are this turn's (the user message and what the loop added).
    turn_start: int
    iteration: int = 0
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    usage: Usage = Field(default_factory=Usage)
    # Non-text replies already made by tools this turn ("reaction", "attachment").
    side_effects: list[str] = Field(default_factory=list)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"LoopState schema_version {v} is not {SCHEMA_VERSION}; refusing")
        return v

    def turn_messages(self) -> list[ChatMessage]:
        return self.messages[self.turn_start :]


@dataclass(frozen=True)
class RunAgain:
    """Tools ran; call the model again."""


@dataclass(frozen=True)
class Final:
    """The model answered without asking for tools."""

    text: str


@dataclass(frozen=True)
class Failed:
    """The turn cannot finish; ``message`` is what the user is told."""

    message: str
    detail: str = ""


NextStep = RunAgain | Final | Failed


class LoopEvents(Protocol):
    """Where the loop reports progress (the run's event stream, in production)."""

    def assistant_delta(self, text: str) -> None: ...

    def tool_start(self, call: ToolCall) -> None: ...

    def tool_result(self, call: ToolCall, result: ToolResult) -> None: ...


def plan_tool_calls(turn: ModelTurn) -> list[ToolCall]:
    """Parse step: the calls to run, in order, with ids made unique. No side effects."""
    seen: set[str] = set()
    plan = []
    for i, call in enumerate(turn.tool_calls):
        call_id = call.id if call.id and call.id not in seen else f"call_{i}"
        seen.add(call_id)
        plan.append(call.model_copy(update={"id": call_id}))
    return plan


def provider_failure(e: ProviderError) -> Failed:
    """The user-facing message for a provider error that ends the turn."""
    if isinstance(e, ProviderRateLimited) and e.retry_after:
        minutes = max(1, round(e.retry_after / 60))
        return Failed(f"You’ve hit your {e.provider} usage limit. Try again in ~{minutes} min.", str(e))
    if isinstance(e, ProviderUnavailable):
        return Failed(f"I couldn't reach the model provider ({e.provider}): {e}", str(e))
    return Failed(f"The model provider failed: {e}", str(e))


class AgentLoop:
    def __init__(
        self,
        provider: Provider,
        tools: ToolRegistry,
        events: LoopEvents,
        *,
        max_tokens: int = 4096,
        check: Callable[[], None] = lambda: None,
        inject: Callable[[], list[str]] = list,
    ):
        self._provider = provider
        self._tools = tools
        self._events = events
        self._max_tokens = max_tokens
        # Called between steps and on every streamed delta: raises a ControlSignal when the
        # turn must stop (cancelled, or its lease lost).
        self._check = check
        # New user messages to add before the next model call (steer mode).
        self._inject = inject

    def _on_delta(self, text: str) -> None:
        self._check()
        self._events.assistant_delta(text)

    def step(self, state: LoopState) -> NextStep:
        """One model call, then the tools it asked for. Mutates ``state``."""
        if state.iteration >= state.max_iterations:
            return Failed(ITERATION_CAP_MESSAGE, f"{state.max_iterations} iterations")
        state.messages.extend(ChatMessage(role="user", content=t) for t in self._inject())
        request = ModelRequest(
            model=state.model,
            system=state.system,
            messages=state.messages,
            tools=self._tools.specs(),
            max_tokens=self._max_tokens,
        )
        try:
            turn = self._provider.complete(request, self._on_delta)
        except ProviderError as e:
            return provider_failure(e)
        state.iteration += 1
        state.usage.input_tokens += turn.input_tokens
        state.usage.output_tokens += turn.output_tokens
        plan = plan_tool_calls(turn)
        state.messages.append(ChatMessage(role="assistant", content=turn.content, tool_calls=plan))
        if not plan:
            return Final(turn.content)
        for call in plan:
            self._check()
            self._events.tool_start(call)
            result = self._tools.execute(call)
            self._events.tool_result(call, result)
            tool = self._tools.get(call.name)
            if tool is not None and tool.delivers and not result.is_error:
                state.side_effects.append(tool.delivers)
            state.messages.append(
                ChatMessage(
                    role="tool",
                    content=result.content,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    is_error=result.is_error,
                )
            )
        return RunAgain()

    def run(self, state: LoopState, checkpoint: Callable[[LoopState], Any]) -> Final | Failed:
        """Step until the turn ends, checkpointing after every step."""
        while True:
            self._check()
            nxt = self.step(state)
            checkpoint(state)
            match nxt:
                case RunAgain():
                    continue
                case Final() | Failed():
                    return nxt
                case _:
                    assert_never(nxt)
