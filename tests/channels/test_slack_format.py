"""Markdown to Slack mrkdwn, chunking long replies under Slack's message limit, and the
Markdown pieces (at most 12,000 characters) of Slack's markdown blocks."""

from __future__ import annotations

import pytest

from fermix_shared.channels.slack_format import (
    CHUNK_LIMIT,
    MARKDOWN_LIMIT,
    MESSAGE_LIMIT,
    fallback_text,
    markdown_block,
    markdown_pieces,
    repair_fences,
    slack_chunks,
    to_mrkdwn,
)


@pytest.mark.parametrize(
    ("md", "mrkdwn"),
    [
        ("**bold** and __bold__", "*bold* and *bold*"),
        ("*italic* and _italic_", "_italic_ and _italic_"),
        ("~~gone~~", "~gone~"),
        ("***both***", "*_both_*"),
        ("see [the docs](https://example.com/a?b=1&c=2).",
         "see <https://example.com/a?b=1&amp;c=2|the docs>."),
        ("[**Bold** label](https://x.io)", "<https://x.io|Bold label>"),
        ("<https://x.io> and https://y.io", "<https://x.io> and https://y.io"),
        ("![chart](https://x.io/c.png)", "<https://x.io/c.png|chart>"),
        ("# Title\n## Sub **bold**", "*Title*\n*Sub bold*"),
        ("- one\n  * two\n+ three", "• one\n  • two\n• three"),
        ("- [ ] todo\n- [x] done", "• ☐ todo\n• ☑ done"),
        ("1. first\n2. second", "1. first\n2. second"),
        ("> quoted **word**", "> quoted *word*"),
        ("a\n\n---\n\nb", "a\n\n──────────\n\nb"),
        ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
        ("ping <!channel> or <@U123ABC>", "ping &lt;!channel&gt; or <@U123ABC>"),
        ("`x < y` and `**not bold**`", "`x &lt; y` and `**not bold**`"),
        ("2*3*4 = 24 and a * b", "2*3*4 = 24 and a * b"),
        ("snake_case_name", "snake_case_name"),
    ],
)
def test_markdown_becomes_mrkdwn(md: str, mrkdwn: str) -> None:
    assert to_mrkdwn(md) == mrkdwn


def test_fenced_code_is_kept_verbatim_without_its_language() -> None:
    md = "Run this:\n\n```python\nif a < b and **c**:\n    print('*x*')\n```\n\nthen **done**."
    assert to_mrkdwn(md) == (
        "Run this:\n\n```\nif a &lt; b and **c**:\n    print('*x*')\n```\n\nthen *done*."
    )


def test_an_unclosed_fence_is_closed() -> None:
    assert to_mrkdwn("```\ncode") == "```\ncode\n```"


def test_short_reply_is_one_message() -> None:
    assert slack_chunks("Hello **there**") == ["Hello *there*"]


def test_long_reply_is_cut_in_order_under_the_limit() -> None:
    paragraphs = [f"Paragraph {i}: " + "word " * 150 for i in range(20)]
    chunks = slack_chunks("\n\n".join(paragraphs))
    assert len(chunks) > 1
    assert all(len(c) <= CHUNK_LIMIT for c in chunks)
    joined = "\n\n".join(chunks)
    positions = [joined.index(f"Paragraph {i}:") for i in range(20)]
    assert positions == sorted(positions)


def test_code_block_cut_across_chunks_is_closed_and_reopened() -> None:
    code = "\n".join(f"x{i} = {i}" for i in range(600))
    chunks = slack_chunks(f"Intro\n\n```python\n{code}\n```\n\nOutro")
    assert len(chunks) >= 2
    for chunk in chunks:
        assert chunk.count("```") % 2 == 0, chunk[:80]
        assert len(chunk) <= MESSAGE_LIMIT
    body = "\n".join(c.replace("```", "") for c in chunks)
    assert all(f"x{i} = {i}\n" in body + "\n" for i in range(600))


def test_repair_fences_reopens_with_the_same_info_string() -> None:
    assert repair_fences(["a\n```sh\nls", "pwd\n```\nb"]) == ["a\n```sh\nls\n```", "```sh\npwd\n```\nb"]


def test_escaping_that_grows_a_chunk_past_the_limit_cuts_it_finer() -> None:
    chunks = slack_chunks("<" * 3000 + " " + "&" * 3000)
    assert all(len(c) <= MESSAGE_LIMIT for c in chunks)
    assert "".join(chunks).replace(" ", "") == "&lt;" * 3000 + "&amp;" * 3000


# -- markdown blocks ---------------------------------------------------------------------------


def test_slacks_markdown_block_limit_is_12000_characters() -> None:
    assert MARKDOWN_LIMIT == 12_000
    assert markdown_block("# Hi") == {"type": "markdown", "text": "# Hi"}


def test_a_short_reply_is_one_piece_kept_as_markdown() -> None:
    md = "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```sh\nls\n```"
    assert markdown_pieces(md) == [md]
    assert fallback_text(md) == "*Title*\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\nls\n```"


def test_a_long_reply_is_cut_into_pieces_at_paragraphs_in_order() -> None:
    paragraphs = [f"Paragraph {i}: " + "word " * 150 for i in range(40)]  # ~30,000 characters
    pieces = markdown_pieces("\n\n".join(paragraphs))
    assert len(pieces) == 3
    assert all(len(p) <= MARKDOWN_LIMIT for p in pieces)
    assert [q.strip() for p in pieces for q in p.split("\n\n")] == [q.strip() for q in paragraphs]


def test_a_cut_prefers_a_break_outside_a_code_block() -> None:
    prose = "lorem ipsum " * 700  # 8,400 characters
    code = "```python\n" + "\n\n".join(f"x{i} = {i}" for i in range(500)) + "\n```"
    pieces = markdown_pieces(f"{prose}\n\n{code}\n\nthe end")
    assert pieces == [prose.strip(), f"{code}\n\nthe end"]  # not cut inside the code


def test_a_code_block_longer_than_a_piece_is_closed_and_reopened() -> None:
    code = "\n".join(f"x{i} = {i}" for i in range(2200))  # ~26,000 characters
    pieces = markdown_pieces(f"Intro\n\n```python\n{code}\n```\n\nOutro")
    assert len(pieces) == 3
    for piece in pieces:
        assert len(piece) <= MARKDOWN_LIMIT
        assert piece.count("```") % 2 == 0, piece[:80]
    assert [p.startswith("```python\n") for p in pieces] == [False, True, True]
    body = "\n".join(pieces)
    assert all(f"x{i} = {i}\n" in body for i in range(2200))


def test_a_half_written_code_block_is_closed() -> None:
    assert markdown_pieces("Look:\n\n```python\nprint(1)") == ["Look:\n\n```python\nprint(1)\n```"]


def test_the_fallback_of_a_long_piece_is_cut_under_the_message_limit() -> None:
    piece = "\n\n".join(f"Paragraph {i}: " + "word " * 150 for i in range(14))  # ~10,800
    text = fallback_text(piece)
    assert len(text) <= MESSAGE_LIMIT
    assert text == slack_chunks(piece, hard_limit=MESSAGE_LIMIT - 2)[0] + "\n…"
    assert fallback_text("a < b") == "a &lt; b"
