"""Response bodies of the run API (``/v1/agent``, ``/v1/runs``: a run, its wait, timeline,
record, replay, fork and case; ``/v1/evals/run``), the conversations and the approvals:
camelCase on the wire, times in ms since the epoch (see docs/http-api.md)."""

from __future__ import annotations

from typing import Any, Literal

from fermix_gateway.api.wire import Absent, Body, Number, OpenBody, event_stream
from fermix_shared.approvals.store import ApprovalStatus
from fermix_shared.models import RunStatus
from fermix_shared.stores.conversations import ConversationState


class Accepted(Body):
    """``POST /v1/agent``, 202: the message's run (``duplicate``: a retry of one taken)."""

    runId: str
    acceptedAt: int
    duplicate: bool


class Conversation(Body):
    """A conversation key, spelled out."""

    channel: str
    chatId: str
    threadScope: str


class Run(Body):
    """``GET /v1/runs/{runId}``: the optional keys appear only when set."""

    runId: str
    status: RunStatus
    conversation: Conversation
    acceptedAt: int
    reply: str | Absent = None
    error: str | Absent = None
    startedAt: int | Absent = None
    endedAt: int | Absent = None
    mergedInto: str | Absent = None
    worker: str | Absent = None
    traceId: str | Absent = None


class RunWait(Body):
    """``GET /v1/runs/{runId}/wait`` (Fased's ``agent.wait``): ``error`` and ``reply`` only
    when the run ended with them."""

    runId: str
    status: RunStatus | Literal["timeout"]
    startedAt: int | None
    endedAt: int | None
    error: str | Absent = None
    reply: str | Absent = None


# ``GET /v1/runs/{runId}/events`` (a response_class of its own keeps the errors JSON).
EVENT_STREAM: dict[str, Any] = {
    "description": "The run's events, replayed from the start (or after `Last-Event-ID`).",
    "content": event_stream("One run event: `id` (its stream entry), `event` (its stream: "
                            "lifecycle, assistant, tool, compaction, thinking, diagnostic), "
                            "`data` (its JSON); the stream closes after the terminal event.",
                            named=True),
}


class TimelineEntry(OpenBody):
    """One entry: a model call (``type: model``, tokens, cost, latency), a tool call (``tool``,
    its duration), or a run event by its stream (``lifecycle``, ``compaction``...) with its
    data."""

    type: str
    at: int


class Timeline(Body):
    """``GET /v1/runs/{runId}/timeline``, oldest first."""

    runId: str
    entries: list[TimelineEntry]


class RecordSize(Body):
    """``GET /v1/runs/{runId}/record``: how much the run's record holds."""

    runId: str
    entries: int
    bytes: int


class ReplayReport(OpenBody):
    """``POST /v1/runs/{runId}/replay``, the worker's report: whether the turn reproduces, its
    steps, the first ``divergence`` (or null), the replies."""

    runId: str
    reproduced: bool
    steps: list[dict[str, Any]]
    divergence: dict[str, Any] | None


class ForkSide(OpenBody):
    """One column of a fork: its run, reply, status, tool calls, tokens, cost, models."""

    runId: str
    reply: str | None


class ForkReport(OpenBody):
    """``POST /v1/runs/{runId}/fork``, the worker's report: the original and the fork from
    ``step``, side by side."""

    step: int
    original: ForkSide
    fork: ForkSide


class EvalResult(OpenBody):
    """``POST /v1/evals/run``, the worker's result of one case: ``passed``, each failed
    expectation in ``failures``, the reply, tool calls, steps, tokens, cost and latency."""

    runId: str | None
    passed: bool
    failures: list[str]
    usd: Number
    latencyS: Number


class RunCase(Body):
    """``GET /v1/runs/{runId}/case``: the recorded run as a suite's ``[[case]]`` table."""

    runId: str
    case: dict[str, Any]


class ConversationRow(Body):
    """One conversation in ``GET /v1/conversations``."""

    conversation: str
    channel: str
    agent: str
    state: ConversationState
    queued: int
    lastActivityAt: int


class ConversationPage(Body):
    """``GET /v1/conversations``: ``total`` match, these from ``offset``."""

    total: int
    offset: int
    conversations: list[ConversationRow]


class ToolCallShown(Body):
    """A tool call of a transcript's message; its arguments are the model's."""

    name: str
    arguments: dict[str, Any]


class Message(Body):
    """A message of a transcript (the tool keys only on tool calls and results)."""

    role: Literal["user", "assistant", "tool", "system"]
    content: str
    toolCalls: list[ToolCallShown] | Absent = None
    toolName: str | Absent = None
    isError: bool | Absent = None


class ConversationDetail(Body):
    """``GET /v1/conversations/{key}``: the last messages of ``length``, why it waits, the
    running turn's run (or null)."""

    conversation: str
    length: int
    why: str
    runId: str | None
    messages: list[Message]


class Approval(Body):
    """A tool call waiting for a person, or answered (then with who, when and why)."""

    id: str
    status: ApprovalStatus
    tool: str
    arguments: dict[str, Any]
    runId: str
    callId: str
    conversation: str
    requester: str
    requestedAt: int
    expiresAt: int
    decidedBy: str | None = None
    decidedAt: int | None = None
    reason: str | Absent = None


class Approvals(Body):
    """``GET /v1/approvals``: pending, soonest expiry first."""

    approvals: list[Approval]


class ApprovalConflict(Approval):
    """``POST /v1/approvals/{id}``, 409: answered already; the reason says by whom, beside
    the approval as it stands."""

    error: str
