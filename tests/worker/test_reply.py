"""Reply shaping: the model's text reaches the user unchanged apart from the silent token, and
the streamed deltas always add up to the final reply."""

from __future__ import annotations

import pytest

from fermix_worker.turn.reply import SilentTokenFilter, is_silent, shape_reply

CODE = "Here:\n\n```python\ndef f(x):\n    if x:\n        return  x  *  2\n```\n\nDone."


def streamed(deltas: list[str]) -> str:
    f = SilentTokenFilter()
    return "".join(f.feed(d) for d in deltas) + f.flush()


def test_formatting_survives_in_the_reply_and_the_stream() -> None:
    assert shape_reply(CODE) == CODE
    assert streamed(list(CODE)) == CODE
    table = "| a  | b   |\n|----|-----|\n| 1  | 22  |"
    assert shape_reply(table) == table


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("NO_REPLY", ""),
        ("no_reply", ""),
        ("  NO_REPLY \n", ""),
        ("Done. NO_REPLY", "Done."),
        ("hello NO_REPLY world", "hello world"),
        ("NO_REPLY_TO=foo", "NO_REPLY_TO=foo"),
        ("set NO_REPLY_TO=foo and XNO_REPLY", "set NO_REPLY_TO=foo and XNO_REPLY"),
        ("the flag `no_reply_mode`", "the flag `no_reply_mode`"),
        ("hello", "hello"),
    ],
)
def test_the_silent_token_is_removed_only_as_a_word(text: str, shown: str) -> None:
    assert shape_reply(text) == shown


SAMPLES = [
    CODE,
    "NO_REPLY",
    "Done. no_reply",
    "hello NO_REPLY world",
    "NO_REPLY_TO=foo stays",
    "x  NO_REPLY\n    indented NO_REPLY_X\n\n  NO_REPLY",
    "  leading and trailing  \n",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_the_stream_adds_up_to_the_final_reply_at_every_split(text: str) -> None:
    final = shape_reply(text)
    assert streamed([text]) == final
    assert streamed(list(text)) == final
    for cut in range(len(text) + 1):
        assert streamed([text[:cut], text[cut:]]) == final, cut


def test_text_that_might_be_the_token_is_held_back_then_released() -> None:
    f = SilentTokenFilter()
    assert f.feed("say NO") == "say"
    assert f.feed("thing") == " NOthing"
    assert f.feed(" N") == ""
    assert f.flush() == " N"
    assert "NO_REPLY" not in streamed(["NO_", "REP", "LY"])


def test_only_a_reply_that_is_just_the_token_is_silent() -> None:
    assert is_silent("NO_REPLY") and is_silent(" no_reply\n") and is_silent("NO_REPLY NO_REPLY")
    assert not is_silent("") and not is_silent("NO_REPLY_TO=foo")
    assert not is_silent("[SILENT]") and is_silent("[silent]", scheduled=True)
    assert not is_silent("Disk 91% full. [SILENT] otherwise", scheduled=True)
