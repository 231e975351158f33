"""Every kind of run event, as a typed record: what a run's Redis stream can hold.

A record names its stream and writes its ``data`` as the wire has always had it (the SSE
endpoints, ``wait`` and the CLI read these fields): camelCase keys (``callId``, ``startedAt``),
the constant tags (``phase``, ``kind``) where each kind puts them, and a few keys left out
rather than sent as ``null`` (``_OPTIONAL``). :class:`~fermix_shared.stores.events.RunEvents`
writes them; ``tests/shared/test_run_events.py`` pins one example of each to its JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

EventStream = Literal["lifecycle", "assistant", "tool", "compaction", "thinking", "diagnostic"]


# Field metadata. A kind's constant fields (``phase``, ``kind``) are ``init=False``: written on
# the wire, never passed.
_OPTIONAL = {"optional": True}  # left out of the wire when None, as the events had it


def _wire(name: str) -> dict[str, str]:
    """The field's key on the wire when it is not the field's name in camelCase."""
    return {"wire": name}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True, kw_only=True)
class RunEventRecord:
    """One event of a run: its ``stream`` and the JSON ``data`` written for it."""

    stream: ClassVar[EventStream]

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("optional"):
                continue
            out[f.metadata.get("wire") or _camel(f.name)] = value
        return out


# -- lifecycle: start, a transient error, the one terminal event -------------------------------


@dataclass(frozen=True, kw_only=True)
class RunStarted(RunEventRecord):
    """The turn's loop starts (again, ``resumed``, after a checkpoint)."""

    stream = "lifecycle"
    phase: Literal["start"] = field(default="start", init=False)
    started_at: float | None
    resumed: bool


@dataclass(frozen=True, kw_only=True)
class RunResuming(RunEventRecord):
    """Not terminal: the turn's worker stopped, another resumes it (a ``start`` follows)."""

    stream = "lifecycle"
    phase: Literal["error"] = field(default="error", init=False)
    transient: Literal[True] = field(default=True, init=False)
    error: str


@dataclass(frozen=True, kw_only=True)
class RunFailed(RunEventRecord):
    """Terminal: the run ended ``error``."""

    stream = "lifecycle"
    phase: Literal["error"] = field(default="error", init=False)
    ended_at: float | None
    error: str | None


@dataclass(frozen=True, kw_only=True)
class RunEnded(RunEventRecord):
    """Terminal: a turn ended with any other status (its reply, None when it had none)."""

    stream = "lifecycle"
    phase: Literal["end"] = field(default="end", init=False)
    ended_at: float | None
    status: str
    reply: str | None


@dataclass(frozen=True, kw_only=True)
class CommandAnswered(RunEventRecord):
    """Terminal: the gateway answered a command at once; its run is created ended."""

    stream = "lifecycle"
    phase: Literal["end"] = field(default="end", init=False)
    status: Literal["ok"] = field(default="ok", init=False)
    reply: str
    ended_at: float


@dataclass(frozen=True, kw_only=True)
class ClearedRunStopped(RunEventRecord):
    """Terminal: the run's message was cleared before it ran (the gateway ends it)."""

    stream = "lifecycle"
    phase: Literal["end"] = field(default="end", init=False)
    status: Literal["stopped"] = field(default="stopped", init=False)
    ended_at: float | None


# -- the loop's output --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AssistantDelta(RunEventRecord):
    """More of the reply being written (coalesced deltas; together they are the reply)."""

    stream = "assistant"
    delta: str


@dataclass(frozen=True, kw_only=True)
class Thinking(RunEventRecord):
    """The model's reasoning text of one call."""

    stream = "thinking"
    text: str


@dataclass(frozen=True, kw_only=True)
class ToolStarted(RunEventRecord):
    """A tool call starts. Tool details (``args`` here, an update's ``text``, a result's
    ``result``) are written only in verbose mode (Fased strips them otherwise); ``phase``,
    ``name``, ``callId`` and a result's ``isError`` always are."""

    stream = "tool"
    phase: Literal["start"] = field(default="start", init=False)
    name: str
    call_id: str
    args: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class ToolUpdated(RunEventRecord):
    """Progress a running tool reported (its ``text`` only in verbose mode)."""

    stream = "tool"
    phase: Literal["update"] = field(default="update", init=False)
    name: str
    call_id: str
    text: str | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class ToolFinished(RunEventRecord):
    """A tool call's result: whether it failed, and its content cut to what a reader needs
    (``result``, only in verbose mode)."""

    stream = "tool"
    phase: Literal["result"] = field(default="result", init=False)
    name: str
    call_id: str
    is_error: bool
    result: str | None = field(default=None, metadata=_OPTIONAL)


# -- compaction ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CompactionScheduled(RunEventRecord):
    """Written before the turn's lifecycle end: a post-turn compaction runs next; its
    ``start`` and ``end`` (or ``error``, or ``cancelled``) follow on this run's stream after
    the lifecycle end, and the SSE stream stays open for them."""

    stream = "compaction"
    phase: Literal["scheduled"] = field(default="scheduled", init=False)
    reason: str


@dataclass(frozen=True, kw_only=True)
class CompactionCancelled(RunEventRecord):
    """A scheduled post-turn compaction was cleared (``/stop``) before it ran."""

    stream = "compaction"
    phase: Literal["cancelled"] = field(default="cancelled", init=False)
    reason: str


@dataclass(frozen=True, kw_only=True)
class CompactionStarted(RunEventRecord):
    stream = "compaction"
    phase: Literal["start"] = field(default="start", init=False)
    reason: str


@dataclass(frozen=True, kw_only=True)
class CompactionErrored(RunEventRecord):
    """The summary failed; history is unchanged."""

    stream = "compaction"
    phase: Literal["error"] = field(default="error", init=False)
    reason: str
    error: str


@dataclass(frozen=True, kw_only=True)
class CompactionEnded(RunEventRecord):
    """Compacted, or nothing to compact (then no sizes)."""

    stream = "compaction"
    phase: Literal["end"] = field(default="end", init=False)
    reason: str
    compacted: bool
    before_tokens: int | None = field(default=None, metadata=_OPTIONAL)
    after_tokens: int | None = field(default=None, metadata=_OPTIONAL)


# -- diagnostics ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Diagnostic(RunEventRecord):
    """What the agent loop reports through ``LoopEvents.diagnostic`` (``iteration``,
    ``loop_guard``): its kind and keywords, as the loop gave them."""

    stream = "diagnostic"
    kind: str
    values: Mapping[str, Any]

    def data(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.values}


@dataclass(frozen=True, kw_only=True)
class RoutingRetry(RunEventRecord):
    """The provider router retries a call on the same route (``initial``: which rule)."""

    stream = "diagnostic"
    kind: Literal["retry"] = field(default="retry", init=False)
    route: str
    attempt: int
    delay: float
    reason: str
    initial: bool


@dataclass(frozen=True, kw_only=True)
class RoutingFailover(RunEventRecord):
    """The provider router moves on to the chain's next route."""

    stream = "diagnostic"
    kind: Literal["failover"] = field(default="failover", init=False)
    from_route: str = field(metadata=_wire("from_route"))
    to_route: str = field(metadata=_wire("to_route"))
    reason: str


@dataclass(frozen=True, kw_only=True)
class SubagentsStarted(RunEventRecord):
    """The turn parked for a fan-out of subagents (the ``subagents`` call ``call_id``)."""

    stream = "diagnostic"
    kind: Literal["subagents"] = field(default="subagents", init=False)
    phase: Literal["start"] = field(default="start", init=False)
    call_id: str
    worker: str


@dataclass(frozen=True, kw_only=True)
class SubagentsEnded(RunEventRecord):
    """The fan-out's reports are in: counts by status, and each task's times and worker."""

    stream = "diagnostic"
    kind: Literal["subagents"] = field(default="subagents", init=False)
    phase: Literal["end"] = field(default="end", init=False)
    call_id: str
    counts: dict[str, int]
    tasks: list[dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class SubagentStarted(RunEventRecord):
    """One subagent (``kind="subagent"``) or skill run (``"skill"``, ``name``) of a fan-out
    starts, on the parent run's stream."""

    stream = "diagnostic"
    kind: Literal["subagent", "skill"]
    name: str | None = field(default=None, metadata=_OPTIONAL)
    phase: Literal["start"] = field(default="start", init=False)
    index: int
    started_at: float
    worker: str


@dataclass(frozen=True, kw_only=True)
class SubagentEnded(RunEventRecord):
    stream = "diagnostic"
    kind: Literal["subagent", "skill"]
    name: str | None = field(default=None, metadata=_OPTIONAL)
    phase: Literal["end"] = field(default="end", init=False)
    index: int
    status: str
    started_at: float
    ended_at: float
    iterations: int
    worker: str


@dataclass(frozen=True, kw_only=True)
class ApprovalAsked(RunEventRecord):
    """The turn parked until a person answers the call's approval (``expires_at`` in ms)."""

    stream = "diagnostic"
    kind: Literal["approval"] = field(default="approval", init=False)
    phase: Literal["asked"] = field(default="asked", init=False)
    call_id: str
    tool: str
    approval_id: str
    expires_at: int
    worker: str


@dataclass(frozen=True, kw_only=True)
class ApprovalAnswered(RunEventRecord):
    stream = "diagnostic"
    kind: Literal["approval"] = field(default="approval", init=False)
    phase: Literal["answered"] = field(default="answered", init=False)
    call_id: str
    approval_id: str
    status: str
    decided_by: str


@dataclass(frozen=True, kw_only=True)
class BudgetRefused(RunEventRecord):
    """A new turn over a budget: refused before any model call."""

    stream = "diagnostic"
    kind: Literal["budget"] = field(default="budget", init=False)
    phase: Literal["refused"] = field(default="refused", init=False)
    scope: str
    period: str
    percent: float


@dataclass(frozen=True, kw_only=True)
class BudgetWarning(RunEventRecord):
    """A budget crossed its warning share (``text`` is what the chat was sent)."""

    stream = "diagnostic"
    kind: Literal["budget"] = field(default="budget", init=False)
    phase: Literal["warning"] = field(default="warning", init=False)
    scope: str
    period: str
    percent: float
    text: str
