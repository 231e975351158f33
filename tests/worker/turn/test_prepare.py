"""Prepare is pure: a claimed turn's inputs become the loop's first state, without Redis."""

from __future__ import annotations

from datetime import UTC, datetime

from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_worker.loop_state import ITERATION_CAPS
from fermix_worker.subagents.prompts import ULTRA_ADDENDUM
from fermix_worker.turn.prepare import PromptOverride, TurnInputs, prepare

KEY = ConversationKey(channel="http", chat_id="c")
NOW = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
PAST = [ChatMessage(role="user", content="earlier"), ChatMessage(role="assistant", content="ok")]


def inputs(*texts: str, **kw: object) -> TurnInputs:
    msgs = [InboundMessage(key=KEY, text=t) for t in texts]
    base: dict[str, object] = {"messages": msgs, "history": PAST, "prompt_base": "You are Fermix.",
                               "facts": "", "now": NOW, "model": "gpt-4.1-mini"}
    return TurnInputs(**{**base, **kw})  # type: ignore[arg-type]


DATE_NOTE = ChatMessage(role="system", content="Current date: Tuesday 2026-12-01 09:30 UTC.")


def test_history_a_fresh_date_note_then_the_user_message_under_the_base() -> None:
    state = prepare(inputs("hello"))
    assert state.messages == [*PAST, DATE_NOTE, ChatMessage(role="user", content="hello")]
    # The turn's own messages start with the user's: the note is neither committed nor reviewed.
    assert state.turn_start == 3 and state.turn_note() == DATE_NOTE
    assert state.system == "You are Fermix." and state.model == "gpt-4.1-mini"
    assert state.max_iterations == ITERATION_CAPS["interactive"] and state.route_override is None


def test_remembered_facts_sit_in_the_note_before_the_date_not_in_the_system_prompt() -> None:
    state = prepare(inputs("hi", facts="Facts:\n- likes tea"))
    assert state.system == "You are Fermix."
    note = state.turn_note()
    assert note is not None and note.content.split("\n\n") == [
        "Facts:\n- likes tea", "Current date: Tuesday 2026-12-01 09:30 UTC."]


def test_the_system_prompt_is_the_same_on_another_day_and_for_other_facts() -> None:
    """The cacheable prefix (system prompt, history) does not move with the per-turn values."""
    one = prepare(inputs("hi", facts="Facts:\n- likes tea"))
    other = prepare(inputs("hi", now=datetime(2027, 3, 4, 18, 5, tzinfo=UTC)))
    assert one.system == other.system
    assert one.messages[:2] == other.messages[:2] == PAST
    assert one.messages[2] != other.messages[2]


def test_collected_messages_become_one_turn_and_share_its_outcome() -> None:
    inp = inputs("first", "second", "third")
    state = prepare(inp)
    assert state.messages[-1].content == "first\n\nsecond\n\nthird"
    assert state.merged_runs == [m.run_id for m in inp.messages[1:]]
    assert state.run_id == inp.messages[0].run_id


def test_ultra_adds_its_addendum_and_a_hook_may_replace_or_prepend() -> None:
    ultra = [InboundMessage(key=KEY, text="dig", profile="ultra")]
    assert prepare(inputs(messages=ultra)).system.endswith(ULTRA_ADDENDUM)
    hooked = prepare(inputs("q", prompt=PromptOverride(system="Custom.", prepend="Context: x")))
    assert hooked.system == "Custom." and hooked.turn_note() is None
    assert hooked.messages[-1].content == "Context: x\n\nq"


def test_a_scheduled_run_gets_its_context_and_a_hook_route_is_kept() -> None:
    job = [InboundMessage(key=KEY, text="report", context="scheduled")]
    state = prepare(inputs(messages=job, route_override="anthropic/claude-x", model="claude-x"))
    assert state.context == "scheduled" and state.max_iterations == ITERATION_CAPS["scheduled"]
    assert (state.route_override, state.model) == ("anthropic/claude-x", "claude-x")


def test_the_available_skills_section_follows_the_base_in_the_system_prompt() -> None:
    skills = "## Available skills\n\n- triage: sort the inbox"
    state = prepare(inputs("hi", facts="Facts:\n- likes tea", skills=skills))
    assert state.system.split("\n\n") == [
        "You are Fermix.", "## Available skills", "- triage: sort the inbox"]
    assert "Available skills" not in prepare(inputs("hi")).system
