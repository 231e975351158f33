"""LoopState: everything a turn's loop needs to continue, on any worker.

One versioned, JSON-serializable record (house rule: no clients, closures or open handles
inside), checkpointed in Redis after every step of :class:`~fermix_worker.loop.AgentLoop`,
which is the only thing that advances it. It lives apart from the loop because more than the
loop reads it: preparing, compacting, checkpointing and closing a turn work on the record
without running a step. Its JSON is the checkpoint format (a :class:`VersionedRecord`: a
checkpoint of another ``schema_version`` is refused, never half-read).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from fermix_shared.messages import ChatMessage
from fermix_shared.records import VersionedRecord
from fermix_worker.guard import GuardState

SCHEMA_VERSION = 1

LoopContext = Literal["interactive", "subagent", "scheduled", "ultra_subagent"]
# The seed's iteration caps by context (system-side, not user configuration).
ITERATION_CAPS: dict[LoopContext, int] = {
    "interactive": 100,
    "subagent": 100,
    "scheduled": 100,
    "ultra_subagent": 40,
}


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0


class LoopState(VersionedRecord):
    """Everything needed to continue a turn on any worker."""

    SCHEMA_VERSION = SCHEMA_VERSION

    run_id: str
    model: str
    system: str
    messages: list[ChatMessage]
    # messages[turn_start:] are this turn's (the user message and what the loop added).
    turn_start: int
    context: LoopContext = "interactive"
    iteration: int = 0
    max_iterations: int = ITERATION_CAPS["interactive"]
    usage: Usage = Field(default_factory=Usage)
    # The provider-reported prompt size of the latest model call (what compaction measures).
    last_input_tokens: int = 0
    guard: GuardState = Field(default_factory=GuardState)
    # Loop-guard warnings to thread into the next model call (each one once).
    pending_warnings: list[str] = Field(default_factory=list)
    # Tool call id -> "started" | "done": a call "started" at resume time never reported.
    journal: dict[str, Literal["started", "done"]] = Field(default_factory=dict)
    # The provider adapter's own transcript after the latest model call (opaque here: its wire
    # messages, Anthropic's thinking blocks included), and how many of ``messages`` it covers:
    # the next call continues from it with the messages after those. None: the next call
    # re-sends the neutral messages (a checkpoint from before it existed, a rebuilt prompt).
    provider_state: dict[str, Any] | None = None
    provider_seen: int = 0
    # The first external tool whose (fenced) result this turn took in: from then on the taint
    # check gates privileged calls (fermix_worker/approvals/taint.py). None: untainted.
    taint: str | None = None
    # Replies already made by tools this turn ("reaction", "attachment", "message").
    side_effects: list[str] = Field(default_factory=list)
    # "tool: error" for each failed tool call (for the fallback reply of an empty turn).
    tool_failures: list[str] = Field(default_factory=list)
    # The route that answered the turn's first call: continuations stay on it, on any worker.
    route: str | None = None
    # The model of that route, i.e. the model that actually answered (after failover or a
    # route chain): compaction measures against its context window.
    answered_model: str | None = None
    # "provider/model" a before_model_resolve hook chose as this turn's primary route.
    route_override: str | None = None
    # The model's final text once it gave one: a turn resumed after that point delivers it
    # instead of asking the model again.
    final: str | None = None
    # Per-call reasoning effort (subagent routing); None leaves the provider's default.
    reasoning_effort: str | None = None
    # The answering agent (fermix_shared/agents/definitions.py) and its sampling temperature (None: the
    # provider's default); fixed when the turn starts, so a resumed turn keeps them.
    agent: str = "default"
    temperature: float | None = None
    # Runs whose messages were merged into this turn (collect, steer): they share its outcome.
    merged_runs: list[str] = Field(default_factory=list)
    # Tool call id -> "pending" (a person was asked), "approved" or "denied: <why>", for calls
    # that need approval (fermix_worker/approvals/policy.py).
    approvals: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def start(
        cls,
        *,
        run_id: str,
        model: str,
        system: str,
        history: list[ChatMessage],
        user: ChatMessage,
        context: LoopContext = "interactive",
    ) -> LoopState:
        return cls(
            run_id=run_id, model=model, system=system, messages=[*history, user],
            turn_start=len(history), context=context, max_iterations=ITERATION_CAPS[context],
        )

    def turn_messages(self) -> list[ChatMessage]:
        return self.messages[self.turn_start :]

    def turn_note(self) -> ChatMessage | None:
        """The turn's per-turn note (facts, date; fermix_worker/turn/prepare.py): the system
        message just before ``turn_start`` (stored history holds none), or None."""
        at = self.turn_start - 1
        note = self.messages[at] if 0 <= at < len(self.messages) else None
        return note if note is not None and note.role == "system" else None


# Between the texts of a turn's steps, in its reply and in its streamed deltas.
REPLY_SEPARATOR = "\n\n"


def interim_texts(state: LoopState) -> list[str]:
    """The text the model wrote this turn alongside its tool calls (before the final answer)."""
    return [m.content for m in state.turn_messages()
            if m.role == "assistant" and m.tool_calls and m.content]


def turn_text(state: LoopState, final: str) -> str:
    """What the user reads of a turn: the text of every step, the final answer last (Fased:
    assistant deltas add up to the reply). History keeps each step's text in its own message."""
    return REPLY_SEPARATOR.join([*interim_texts(state), final] if final else interim_texts(state))
