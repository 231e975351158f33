"""Compaction planning and the context-window catalog (pure)."""

from __future__ import annotations

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.settings import Settings
from fermix_worker.compaction import CHECKPOINT_PREFIX, plan
from fermix_worker.providers.context_windows import FALLBACK_WINDOW, context_window


def turn(i: int, tools: bool = False) -> list[ChatMessage]:
    msgs = [ChatMessage(role="user", content=f"question {i}")]
    if tools:
        msgs += [
            ChatMessage(role="assistant", tool_calls=[ToolCall(id=f"t{i}", name="calculator")]),
            ChatMessage(role="tool", content="42", tool_call_id=f"t{i}", tool_name="calculator"),
        ]
    return [*msgs, ChatMessage(role="assistant", content=f"answer {i}")]


def test_the_cut_keeps_recent_turns_and_never_splits_a_tool_call_from_its_result() -> None:
    history = [m for i in range(8) for m in turn(i, tools=i % 2 == 0)]
    p = plan(history, keep_turns=3)
    assert p is not None
    assert p.tail[0] == ChatMessage(role="user", content="question 5")
    assert [m.content for m in p.tail if m.role == "user"] == ["question 5", "question 6", "question 7"]
    assert p.head + p.tail == history
    # Every tool result sits with its call, on the same side of the cut.
    for part in (p.head, p.tail):
        calls = {c.id for m in part for c in m.tool_calls}
        results = {m.tool_call_id for m in part if m.role == "tool"}
        assert calls == results


def test_nothing_to_compact_in_a_short_conversation() -> None:
    assert plan([m for i in range(3) for m in turn(i)], keep_turns=4) is None
    assert plan([], keep_turns=4) is None


def test_a_previous_checkpoint_is_summarized_again_with_what_followed() -> None:
    checkpoint = ChatMessage(role="user", content=CHECKPOINT_PREFIX + "earlier notes")
    history = [checkpoint, *[m for i in range(5) for m in turn(i)]]
    p = plan(history, keep_turns=4)
    assert p is not None and p.head[0] == checkpoint


def test_context_windows_come_from_the_catalog_toml_or_env() -> None:
    s = Settings(context_windows={"my-local-model": 32_000}, context_window=8_192)
    assert context_window("claude-sonnet-4-5", s) == 200_000
    assert context_window("gpt-4.1-mini", s) == 1_047_576
    assert context_window("my-local-model", s) == 32_000
    assert context_window("llama3:8b", s) == 8_192
    assert context_window("llama3:8b", Settings()) == FALLBACK_WINDOW
