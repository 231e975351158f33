"""Each kind of run event writes the JSON the run's stream has always carried: the SSE
endpoints, ``wait`` and the CLI read these keys, in this order, with these keys left out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fermix_shared import run_events as ev
from fermix_shared.run_events import EventStream, RunEventRecord

TASKS = [{"index": 0, "status": "completed", "startedAt": 1.0, "endedAt": 2.0, "worker": "w1"}]
COUNTS = {"tasks": 1, "completed": 1, "failed": 0, "timed_out": 0, "cancelled": 0}

# (the record, its stream, the data as the call site wrote it before events were typed)
EXAMPLES: list[tuple[RunEventRecord, EventStream, dict[str, Any]]] = [
    (ev.RunStarted(started_at=1.5, resumed=False), "lifecycle",
     dict(phase="start", startedAt=1.5, resumed=False)),
    (ev.RunResuming(error="resuming it on another worker"), "lifecycle",
     dict(phase="error", transient=True, error="resuming it on another worker")),
    (ev.RunFailed(ended_at=2.5, error="Something went wrong."), "lifecycle",
     dict(phase="error", endedAt=2.5, error="Something went wrong.")),
    (ev.RunEnded(ended_at=2.5, status="stopped", reply=None), "lifecycle",
     dict(phase="end", endedAt=2.5, status="stopped", reply=None)),
    (ev.CommandAnswered(reply="Commands: ...", ended_at=3.0), "lifecycle",
     dict(phase="end", status="ok", reply="Commands: ...", endedAt=3.0)),
    (ev.ClearedRunStopped(ended_at=3.0), "lifecycle",
     dict(phase="end", status="stopped", endedAt=3.0)),
    (ev.AssistantDelta(delta="Hello"), "assistant", dict(delta="Hello")),
    (ev.Thinking(text="Let me see."), "thinking", dict(text="Let me see.")),
    (ev.ToolStarted(name="calculator", call_id="c1", args={"expression": "1+1"}), "tool",
     dict(phase="start", name="calculator", callId="c1", args={"expression": "1+1"})),
    (ev.ToolUpdated(name="run_command", call_id="c2", text="building"), "tool",
     dict(phase="update", name="run_command", callId="c2", text="building")),
    (ev.ToolFinished(name="calculator", call_id="c1", is_error=False, result="2"), "tool",
     dict(phase="result", name="calculator", callId="c1", isError=False, result="2")),
    # Without verbose mode a tool event has no details (no args, text or result).
    (ev.ToolStarted(name="calculator", call_id="c1"), "tool",
     dict(phase="start", name="calculator", callId="c1")),
    (ev.ToolFinished(name="calculator", call_id="c1", is_error=True), "tool",
     dict(phase="result", name="calculator", callId="c1", isError=True)),
    (ev.CompactionScheduled(reason="auto"), "compaction", dict(phase="scheduled", reason="auto")),
    (ev.CompactionCancelled(reason="auto"), "compaction", dict(phase="cancelled", reason="auto")),
    (ev.CompactionStarted(reason="auto"), "compaction", dict(phase="start", reason="auto")),
    (ev.CompactionErrored(reason="command", error="the summary call failed"), "compaction",
     dict(phase="error", reason="command", error="the summary call failed")),
    (ev.CompactionEnded(reason="auto", compacted=True, before_tokens=9000, after_tokens=800),
     "compaction",
     dict(phase="end", reason="auto", compacted=True, beforeTokens=9000, afterTokens=800)),
    (ev.CompactionEnded(reason="command", compacted=False), "compaction",
     dict(phase="end", reason="command", compacted=False)),
    (ev.Diagnostic(kind="iteration", values={"iteration": 1, "model": "m", "inputTokens": 10,
                                             "outputTokens": 5}), "diagnostic",
     dict(kind="iteration", iteration=1, model="m", inputTokens=10, outputTokens=5)),
    (ev.RoutingRetry(route="openai/m", attempt=1, delay=0.5, reason="HTTP 503", initial=True),
     "diagnostic",
     dict(kind="retry", route="openai/m", attempt=1, delay=0.5, reason="HTTP 503", initial=True)),
    (ev.RoutingFailover(from_route="openai/m", to_route="anthropic/c", reason="HTTP 429"),
     "diagnostic",
     dict(kind="failover", from_route="openai/m", to_route="anthropic/c", reason="HTTP 429")),
    (ev.SubagentsStarted(call_id="c3", worker="w1"), "diagnostic",
     dict(kind="subagents", phase="start", callId="c3", worker="w1")),
    (ev.SubagentsEnded(call_id="c3", counts=COUNTS, tasks=TASKS), "diagnostic",
     dict(kind="subagents", phase="end", callId="c3", counts=COUNTS, tasks=TASKS)),
    (ev.SubagentStarted(kind="subagent", index=0, started_at=1.0, worker="w1"), "diagnostic",
     dict(kind="subagent", phase="start", index=0, startedAt=1.0, worker="w1")),
    (ev.SubagentEnded(kind="skill", name="triage", index=1, status="completed", started_at=1.0,
                      ended_at=2.0, iterations=3, worker="w2"), "diagnostic",
     dict(kind="skill", name="triage", phase="end", index=1, status="completed", startedAt=1.0,
          endedAt=2.0, iterations=3, worker="w2")),
    (ev.ApprovalAsked(call_id="c4", tool="run_command", approval_id="ap1", expires_at=1700,
                      worker="w1"), "diagnostic",
     dict(kind="approval", phase="asked", callId="c4", tool="run_command", approvalId="ap1",
          expiresAt=1700, worker="w1")),
    (ev.ApprovalAnswered(call_id="c4", approval_id="ap1", status="approved", decided_by="ops"),
     "diagnostic",
     dict(kind="approval", phase="answered", callId="c4", approvalId="ap1", status="approved",
          decidedBy="ops")),
    (ev.BudgetRefused(scope="agent:default", period="day", percent=166.7), "diagnostic",
     dict(kind="budget", phase="refused", scope="agent:default", period="day", percent=166.7)),
    (ev.BudgetWarning(scope="agent:default", period="day", percent=83.3, text="Heads up"),
     "diagnostic",
     dict(kind="budget", phase="warning", scope="agent:default", period="day", percent=83.3,
          text="Heads up")),
]


@pytest.mark.parametrize(("record", "stream", "today"), EXAMPLES,
                         ids=[type(e[0]).__name__ for e in EXAMPLES])
def test_a_record_writes_exactly_the_json_of_its_kind(
    record: RunEventRecord, stream: EventStream, today: dict[str, Any]
) -> None:
    assert record.stream == stream
    assert json.dumps(record.data()) == json.dumps(today)


def test_every_kind_has_an_example() -> None:
    kinds = {cls for cls in vars(ev).values()
             if isinstance(cls, type) and issubclass(cls, RunEventRecord) and cls is not RunEventRecord}
    assert kinds == {type(record) for record, _, _ in EXAMPLES}


def test_a_kinds_constant_fields_are_not_arguments() -> None:
    with pytest.raises(TypeError):
        ev.RunResuming(error="x", transient=False)  # type: ignore[call-arg]
