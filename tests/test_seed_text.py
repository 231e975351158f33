"""The seed copies are the reference pages, and quoted() refuses words they do not say."""

import pytest

from tests.seed_text import quoted, seed_text


def test_each_page_is_there_and_quoted_finds_its_words():
    assert quoted("F", "Trimmed older conversation history to stay within the context window.")
    assert quoted("O", "[context overflow, recovering...]")
    assert "agent.wait" in seed_text("S")


def test_quoted_refuses_words_the_seed_does_not_say():
    with pytest.raises(AssertionError, match="does not say"):
        quoted("O", "You have called the same tool 8 times in a row.")
