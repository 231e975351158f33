"""LoopGuard with the seed's numbers: window 10, warn at 3 repeats, kill at 5."""

from __future__ import annotations

from typing import Any

from fermix_shared.messages import ToolCall
from fermix_shared.settings import LoopGuardConfig, Settings
from fermix_worker.guard import (
    GuardConfig,
    GuardState,
    GuardVerdict,
    LoopGuard,
    signature,
)
from tests.seed_text import quoted

REPEAT_WARNING = (
    "Repeated tool call warning: search was called 3 times with the same arguments. "
    "Do not call it again unless the arguments or plan meaningfully change."
)


# OpenFang's words: "When triggered, the guard injects a system message: ..."
SEED_STREAK = quoted("O", "**LOOP DETECTED**: You have called the same tool 5 times in a row. "
                          "Consider a different approach or provide a final answer.")


def streak_warning(tool: str, n: int) -> str:
    """The seed's notice for a streak of ``n`` (the seed's own text at its default, 5)."""
    del tool  # the seed's notice does not name the tool
    return SEED_STREAK.replace("5 times", f"{n} times")


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
    guard, state = LoopGuard(GuardConfig(streak_warn=99)), GuardState()
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
    assert all(v.kill is None for v in verdicts)
    # Only the same-tool streak speaks up, once; no repeat warning.
    assert [w for v in verdicts for w in v.warnings] == [SEED_STREAK]


def test_ping_pong_warns_at_four_alternating_calls_and_kills_at_eight() -> None:
    guard, state = LoopGuard(), GuardState()
    a, b = call("read_file", path="a.txt"), call("list_dir", path=".")
    v = feed(guard, state, [a, b, a, b, a, b, a, b])
    assert v[0].warnings == v[1].warnings == v[2].warnings == []
    # OpenFang's notice, in its words, for the A-B-A-B pattern ("max_tool_pair_ping_pong").
    head, tail = quoted("O", "**LOOP DETECTED**:"), quoted(
        "O", "Consider a different approach or provide a final answer.")
    assert v[3].warnings == [
        f"{head} You have alternated between the same two tools (read_file and list_dir) 4 times "
        f"in a row. {tail}"
    ]
    # No second ping-pong warning (the 3rd repeats of each side warn on their own rule).
    assert not any("alternated" in w for x in v[4:7] for w in x.warnings)
    assert all(x.kill is None for x in v[:7])
    assert v[7].kill == (
        "Ping-pong tool call loop detected: read_file and list_dir keep alternating "
        "without progress."
    )


def test_ping_pong_is_broken_by_a_third_call() -> None:
    guard, state = LoopGuard(GuardConfig(warn_at=99, kill_at=99, streak_warn=99)), GuardState()
    a, b, c = call(q="a"), call(q="b"), call(q="c")
    verdicts = feed(guard, state, [a, b, a, c, a, b, a, c, a, b, a, c])
    assert all(v == GuardVerdict([], None) for v in verdicts)


def test_same_call_over_and_over_is_not_ping_pong() -> None:
    guard, state = LoopGuard(GuardConfig(warn_at=99, kill_at=99, streak_warn=99)), GuardState()
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
    guard, state = LoopGuard(GuardConfig(streak_warn=99)), GuardState()
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


# -- same-tool streak --------------------------------------------------------------------------


def pages(n: int, name: str = "search", start: int = 0) -> list[ToolCall]:
    return [call(name, q=f"page {i}") for i in range(start, start + n)]


def test_one_tool_five_times_in_a_row_with_changing_arguments_warns_once() -> None:
    guard, state = LoopGuard(), GuardState()
    verdicts = feed(guard, state, pages(20))
    assert [v.warnings for v in verdicts[:4]] == [[]] * 4
    assert verdicts[4] == GuardVerdict([SEED_STREAK], None)
    # A warning, never a kill, and not repeated for the rest of the streak.
    assert all(v == GuardVerdict([], None) for v in verdicts[5:])


def test_a_call_to_another_tool_resets_the_streak() -> None:
    guard, state = LoopGuard(), GuardState()
    quiet = feed(guard, state, [*pages(4), call("read_file", path="a"), *pages(4, start=4)])
    assert all(v == GuardVerdict([], None) for v in quiet)
    # The fifth search since read_file.
    assert guard.observe(state, [call(q="page 8")]).warnings == [SEED_STREAK]


def test_a_streak_in_one_batch_warns_in_that_step() -> None:
    guard, state = LoopGuard(), GuardState()
    assert guard.observe(state, pages(6)) == GuardVerdict([SEED_STREAK], None)


def test_identical_calls_count_in_the_streak_any_arguments() -> None:
    # "the same tool N times in a row": arguments do not matter (the repeat rule is off here).
    guard, state = LoopGuard(GuardConfig(warn_at=99, kill_at=99)), GuardState()
    same = call(q="page 1")
    verdicts = feed(guard, state, [*pages(1), same, same, same, same])
    assert verdicts[4].warnings == [SEED_STREAK]


def test_streak_survives_a_checkpoint_and_old_checkpoints_still_load() -> None:
    guard, state = LoopGuard(), GuardState()
    feed(guard, state, pages(3))
    restored = GuardState.model_validate_json(state.model_dump_json())
    verdicts = feed(guard, restored, pages(2, start=3))
    assert verdicts[1].warnings == [SEED_STREAK]
    # A checkpoint written before the streak rule existed.
    old = GuardState.model_validate_json('{"window": [], "history": [], "warned": [], "total_calls": 4}')
    assert old.total_calls == 4
    assert feed(guard, old, pages(5))[4].warnings == [SEED_STREAK]


# -- thresholds from configuration -------------------------------------------------------------


def test_default_configuration_is_the_seed_numbers() -> None:
    assert GuardConfig.from_settings(Settings(loop_guard=LoopGuardConfig())) == GuardConfig(
        window=10, warn_at=3, kill_at=5, pingpong_warn=4, pingpong_kill=8, max_tool_calls=250,
        streak_warn=5,
    )


def test_configured_thresholds_change_when_the_guard_warns_and_kills() -> None:
    settings = Settings(loop_guard=LoopGuardConfig(
        window=4, warn_at=2, kill_at=3, max_tool_calls=6, streak_warn=3))
    guard, state = LoopGuard(GuardConfig.from_settings(settings)), GuardState()
    v = feed(guard, state, [call(), call(), call()])
    assert v[1].warnings == [REPEAT_WARNING.replace("3 times", "2 times")]
    assert v[2].kill == (
        "Repeated tool call loop detected: search was called 3 times with the same arguments."
    )

    guard, state = LoopGuard(GuardConfig.from_settings(settings)), GuardState()
    v = feed(guard, state, pages(7))
    assert v[2].warnings == [streak_warning("search", 3)]
    assert v[6].kill is not None and "made 7 tool calls, the limit is 6" in v[6].kill
