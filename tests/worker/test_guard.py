"""LoopGuard with the seed's numbers: window 10, warn at 3 repeats, kill at 5."""

from __future__ import annotations

from typing import Any

from fermix_shared.messages import ToolCall
from fermix_worker.guard import (
    GuardConfig,
    GuardState,
    GuardVerdict,
    LoopGuard,
    signature,
)

REPEAT_WARNING = (
    "Repeated tool call warning: search was called 3 times with the same arguments. "
    "Do not call it again unless the arguments or plan meaningfully change."
)


def call(name: str = "search", **args: Any) -> ToolCall:
    return ToolCall(id="c", name=name, arguments=args or {"q": "fermix"})


def feed(guard: LoopGuard, state: GuardState, calls: list[ToolCall]) -> list[GuardVerdict]:
    """One model step per call, as a model that asks for one tool at a time."""
    return [guard.observe(state, [c]) for c in calls]


def test_signature_normalizes_argument_order() -> None:
    a = ToolCall(id="1", name="search", arguments={"q": "x", "limit": 5, "opts": {"b": 1, "a": 2}})
    b = ToolCall(id="2", name="search", arguments={"opts": {"a": 2, "b": 1}, "limit": 5, "q": "x"})
    assert signature(a) == signature(b) == 'search:{"limit":5,"opts":{"a":2,"b":1},"q":"x"}'
    assert signature(a) != signature(call("fetch", q="x", limit=5, opts={"a": 2, "b": 1}))


def test_third_repeat_warns_once_fourth_is_quiet_fifth_kills() -> None:
    guard, state = LoopGuard(), GuardState()
    v = feed(guard, state, [call()] * 5)
    assert v[0] == v[1] == GuardVerdict([], None)
    assert v[2] == GuardVerdict([REPEAT_WARNING], None)
    assert v[3] == GuardVerdict([], None)
    assert v[4].kill == (
        "Repeated tool call loop detected: search was called 5 times with the same arguments."
    )
    assert v[4].kill.startswith("Repeated tool call loop detected")


def test_same_call_with_keys_in_another_order_is_a_repeat() -> None:
    guard, state = LoopGuard(), GuardState()
    calls = [call(q="x", n=1), call(n=1, q="x"), call(q="x", n=1), call(n=1, q="x"), call(q="x", n=1)]
    v = feed(guard, state, calls)
    assert len(v[2].warnings) == 1 and v[4].kill is not None


def test_repeats_in_one_batch_warn_then_kill_and_stop_at_the_kill() -> None:
    guard, state = LoopGuard(), GuardState()
    verdict = guard.observe(state, [call()] * 6)
    assert verdict.warnings == [REPEAT_WARNING]
    assert verdict.kill is not None and "5 times" in verdict.kill
    assert state.total_calls == 5  # the sixth call was never looked at


def test_repeats_outside_the_window_of_ten_do_not_count() -> None:
    guard, state = LoopGuard(), GuardState()
    others = [call(q=f"other {i}") for i in range(8)]
    # A, 8 others, A, A: the first A has left the window of 10 by the third.
    verdicts = feed(guard, state, [call(), *others, call(), call()])
    assert all(v == GuardVerdict([], None) for v in verdicts)
    # One more A: now three in the window.
    assert guard.observe(state, [call()]).warnings == [REPEAT_WARNING]
    assert len(state.window) == 10


def test_different_arguments_are_not_repeats() -> None:
    guard, state = LoopGuard(), GuardState()
    verdicts = feed(guard, state, [call(q=f"page {i}") for i in range(40)])
    assert all(v == GuardVerdict([], None) for v in verdicts)


def test_ping_pong_warns_at_four_alternating_calls_and_kills_at_eight() -> None:
    guard, state = LoopGuard(), GuardState()
    a, b = call("read_file", path="a.txt"), call("list_dir", path=".")
    v = feed(guard, state, [a, b, a, b, a, b, a, b])
    assert v[0].warnings == v[1].warnings == v[2].warnings == []
    assert v[3].warnings == [
        "Ping-pong tool call warning: read_file and list_dir keep alternating. "
        "Change the approach or give a final answer."
    ]
    # No second ping-pong warning (the 3rd repeats of each side warn on their own rule).
    assert not any(w.startswith("Ping-pong") for x in v[4:7] for w in x.warnings)
    assert all(x.kill is None for x in v[:7])
    assert v[7].kill == (
        "Ping-pong tool call loop detected: read_file and list_dir keep alternating "
        "without progress."
    )


def test_ping_pong_is_broken_by_a_third_call() -> None:
    guard, state = LoopGuard(GuardConfig(warn_at=99, kill_at=99)), GuardState()
    a, b, c = call(q="a"), call(q="b"), call(q="c")
    verdicts = feed(guard, state, [a, b, a, c, a, b, a, c, a, b, a, c])
    assert all(v == GuardVerdict([], None) for v in verdicts)


def test_same_call_over_and_over_is_not_ping_pong() -> None:
    guard, state = LoopGuard(GuardConfig(warn_at=99, kill_at=99)), GuardState()
    verdicts = feed(guard, state, [call()] * 20)
    assert all(v == GuardVerdict([], None) for v in verdicts)


def test_circuit_breaker_stops_the_251st_tool_call() -> None:
    guard, state = LoopGuard(), GuardState()
    verdicts = feed(guard, state, [call(q=f"page {i}") for i in range(250)])
    assert all(v.kill is None for v in verdicts)
    verdict = guard.observe(state, [call(q="one more")])
    assert verdict.kill == (
        "Tool call limit reached: this turn made 251 tool calls, the limit is 250. "
        "Stopping to avoid a runaway loop."
    )


def test_circuit_breaker_limit_is_configurable_and_counts_batches() -> None:
    guard, state = LoopGuard(GuardConfig(max_tool_calls=3)), GuardState()
    assert guard.observe(state, [call(q="1"), call(q="2")]).kill is None
    verdict = guard.observe(state, [call(q="3"), call(q="4"), call(q="5")])
    assert verdict.kill is not None and "made 4 tool calls, the limit is 3" in verdict.kill


def test_state_round_trips_through_json_and_keeps_counting() -> None:
    guard, state = LoopGuard(), GuardState()
    feed(guard, state, [call(), call(), call(), call(q="big " * 10_000)])
    raw = state.model_dump_json()
    assert len(raw) < 2_000  # digests, not argument bodies
    restored = GuardState.model_validate_json(raw)
    assert restored == state
    # The warning was already given before the checkpoint: not again; the 5th still kills.
    assert guard.observe(restored, [call()]).warnings == []
    assert guard.observe(restored, [call()]).kill is not None


def test_state_stays_bounded() -> None:
    guard, state = LoopGuard(GuardConfig(max_tool_calls=10_000)), GuardState()
    for i in range(300):
        guard.observe(state, [call(q=str(i % 150))] * 3)
    assert len(state.window) == 10
    assert len(state.history) == 8
    assert len(state.warned) <= 64
