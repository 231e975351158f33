"""The turn's event sink: streamed text is coalesced into fewer ``assistant`` events (each is
a Redis XADD), in order with every other event, and nothing is lost or reordered."""

from __future__ import annotations

from typing import Any

import redis

from fermix_shared import keys
from fermix_shared.messages import ToolCall
from fermix_shared.run_events import AssistantDelta, RunEnded, RunEventRecord
from fermix_shared.stores.events import RunEvents
from fermix_worker.tools.base import ToolResult
from fermix_worker.turn.events import DELTA_INTERVAL_S, EventSink
from tests.fleet import uniq
from tests.seed_text import quoted


class Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: RunEventRecord) -> None:
        self.emitted.append((event.stream, event.data()))


def test_deltas_within_the_interval_merge_and_other_events_keep_their_order() -> None:
    now = [100.0]
    events = Events()
    sink = EventSink(events, clock=lambda: now[0], verbose=True)  # type: ignore[arg-type]
    step = DELTA_INTERVAL_S / 5
    for word in ("Hello", " there", ",", " how"):  # the first goes at once, the rest wait
        sink.assistant_delta(word)
        now[0] += step
    now[0] += DELTA_INTERVAL_S
    sink.assistant_delta(" are")  # past the interval: everything held so far, with it
    sink.assistant_delta(" you")
    call = ToolCall(id="c1", name="calculator", arguments={})
    sink.tool_start(call)  # held text goes first
    sink.tool_result(call, ToolResult("1"))
    sink.assistant_delta("?")
    sink.flush()
    assert events.emitted == [
        ("assistant", {"delta": "Hello"}),
        ("assistant", {"delta": " there, how are"}),
        ("assistant", {"delta": " you"}),
        ("tool", {"phase": "start", "name": "calculator", "callId": "c1", "args": {}}),
        ("tool", {"phase": "result", "name": "calculator", "callId": "c1", "isError": False,
                  "result": "1"}),
        ("assistant", {"delta": "?"}),
    ]


def test_tool_details_and_reasoning_reach_the_stream_only_when_enabled() -> None:
    """Fased: "Tool details are stripped unless verbose mode allows them"; `thinking` is
    "streamed reasoning text when enabled"."""
    assert quoted("S", "Tool details are stripped unless verbose mode allows them")
    assert quoted("S", "`thinking`: streamed reasoning text when enabled")
    call = ToolCall(id="c1", name="read_file", arguments={"path": "secrets.txt"})

    def run(sink: EventSink) -> None:
        sink.thinking("I should read the file.")
        sink.tool_start(call)
        sink.tool_update(call, "reading")
        sink.tool_result(call, ToolResult("API_KEY=sk-123", is_error=False))

    quiet, loud = Events(), Events()
    run(EventSink(quiet))  # type: ignore[arg-type]
    run(EventSink(loud, verbose=True, thinking=True))  # type: ignore[arg-type]
    # Which tool, which call, its phase and whether it failed: nothing of what it read.
    assert quiet.emitted == [
        ("tool", {"phase": "start", "name": "read_file", "callId": "c1"}),
        ("tool", {"phase": "update", "name": "read_file", "callId": "c1"}),
        ("tool", {"phase": "result", "name": "read_file", "callId": "c1", "isError": False}),
    ]
    assert loud.emitted == [
        ("thinking", {"text": "I should read the file."}),
        ("tool", {"phase": "start", "name": "read_file", "callId": "c1",
                  "args": {"path": "secrets.txt"}}),
        ("tool", {"phase": "update", "name": "read_file", "callId": "c1", "text": "reading"}),
        ("tool", {"phase": "result", "name": "read_file", "callId": "c1", "isError": False,
                  "result": "API_KEY=sk-123"}),
    ]


def test_the_stream_gets_its_ttl_once_per_writer(r: redis.Redis) -> None:
    run_id = uniq("run")
    events = RunEvents(r, run_id)
    events.emit(AssistantDelta(delta="a"))
    r.persist(keys.run_events(run_id))
    events.emit(AssistantDelta(delta="b"))  # no second EXPIRE from this writer
    assert r.ttl(keys.run_events(run_id)) == -1
    # A new writer sets it again.
    RunEvents(r, run_id).emit(RunEnded(ended_at=None, status="ok", reply=None))
    assert r.ttl(keys.run_events(run_id)) > 0
    assert r.xlen(keys.run_events(run_id)) == 3
