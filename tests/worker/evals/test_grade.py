"""The rubric grader's answer read, and what it is asked."""

from __future__ import annotations

import pytest

from fermix_shared.messages import ChatMessage
from fermix_worker.evals.grade import grader_prompt, verdict


@pytest.mark.parametrize(("text", "passed", "reason"), [
    ("PASS\nIt says 42.", True, "It says 42."),
    ("**FAIL**: it never says 42.", False, "it never says 42."),
    ("pass - fine", True, "fine"),
    ("> FAIL", False, ""),
    ("I think it passes.", False, "the grader answered neither PASS nor FAIL: 'I think it passes.'"),
    ("PASSABLE", False, "the grader answered neither PASS nor FAIL: 'PASSABLE'"),
])
def test_the_first_word_decides(text: str, passed: bool, reason: str) -> None:
    got = verdict(text)
    assert (got.passed, got.reason) == (passed, reason)


def test_the_grader_sees_what_the_user_saw_and_the_reference() -> None:
    convo = [ChatMessage(role="user", content="6*7?"),
             ChatMessage(role="assistant", content="", tool_calls=[]),
             ChatMessage(role="tool", content="6*7 = 42", tool_call_id="c1")]
    prompt = grader_prompt(convo, "42", "Gives the product.", "It is 42.")
    assert prompt.startswith("Rubric:\nGives the product.\n\nConversation:\nuser: 6*7?\n\n")
    assert "6*7 = 42" not in prompt  # no tool exchanges
    assert "A reference reply, known to be good:\nIt is 42." in prompt
