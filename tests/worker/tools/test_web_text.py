"""An HTML page's readable text: its title, its links made absolute, hostile HTML survived, and
no network touched while converting."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from fermix_worker.tools.web import FETCH_MAX_BYTES, FETCH_MAX_CHARS
from fermix_worker.tools.web_text import absolute_links, page_title, readable, window

SAVED = Path(__file__).parent / "pages"
URL = "https://docs.example/guide/advanced/pools.html"


def test_the_title_is_the_heads_unescaped_on_one_line() -> None:
    page = ("<html><head><title>\n  Pools &amp; limits &mdash;\n Quill </title></head>"
            "<body><svg><title>github</title></svg></body></html>")
    assert page_title(page) == "Pools & limits — Quill"
    assert page_title("<html><body><svg><title>github</title></svg></body></html>") is None


def test_links_are_joined_to_the_pages_url() -> None:
    markdown = ("[up](../timeouts/) [here](#pool) [root](/api/) [abs](https://x.test/a) "
                "[mail](mailto:a@b.test) ![logo](img/logo.png)")
    assert absolute_links(markdown, URL) == (
        "[up](https://docs.example/guide/timeouts/) [here](https://docs.example/guide/advanced/"
        "pools.html#pool) [root](https://docs.example/api/) [abs](https://x.test/a) "
        "[mail](mailto:a@b.test) ![logo](https://docs.example/guide/advanced/img/logo.png)")


def test_a_tiny_page_keeps_its_text() -> None:
    page = readable("<html><head><title>T</title></head><body><p>Hi there</p></body></html>",
                    URL, FETCH_MAX_CHARS)
    assert (page.title, page.text, page.note) == ("T", "Hi there", "")


def test_a_page_of_links_falls_back_to_html2text() -> None:
    links = "".join(f'<li><a href="p{i}.html">Page {i}</a></li>' for i in range(12))
    page = readable(f"<html><body><nav><ul>{links}</ul></nav></body></html>", URL,
                    FETCH_MAX_CHARS)
    assert page.converter == "html2text"
    assert "[Page 11](https://docs.example/guide/advanced/p11.html)" in page.text


def test_a_window_is_an_exact_slice_cut_at_a_line_end_that_names_the_next_offset() -> None:
    text = "one line\n" * 3 + "x" * 25  # 27 characters of lines, then one long line
    assert window(text, 0, 100) == (text, "")
    assert window(text, 0, 20) == ("one line\none line\n", "[truncated: characters 0-18 of 52; "
                                   "call again with offset=18 for more]")
    # No line end in the last quarter: cut mid-line, at the bound.
    assert window(text, 18, 20) == ("one line\nxxxxxxxxxxx", "[truncated: characters 18-38 of "
                                    "52; call again with offset=38 for more]")
    assert window(text, 38, 20) == ("x" * 14, "[characters 38-52 of 52: the end of the text]")
    assert window(text, 52, 20) == ("", "[offset=52 is past the end: the text has 52 characters]")


N = FETCH_MAX_BYTES  # hostile pages as large as a fetch reads
HOSTILE = {
    # html2text indents every line by its depth: Markdown quadratic in the HTML, stopped.
    "lists nested 25,000 deep": "<html><body>" + "<ul><li>" * (N // 8),
    "quotes nested 15,000 deep": "<html><body>" + "<blockquote>x" * (N // 13),
    "divs nested 40,000 deep": "<html><body>" + "<div>" * (N // 5) + "x",
    "an unclosed comment": "<html><body><p>Before</p><!--" + "-" * N,
    "5,000 cells in one row": "<html><body><table><tr>" + "<td>c</td>" * 5_000 + "</tr></table>",
    "bytes that are not HTML": bytes(range(1, 256)).decode("latin-1") * (N // 255),
}


@pytest.mark.parametrize("page", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_html_neither_hangs_nor_raises(page: str) -> None:
    started = time.monotonic()
    result = readable(page, URL, FETCH_MAX_CHARS)
    assert time.monotonic() - started < 15  # seconds; each takes under 0.5 here
    assert len(result.text) <= FETCH_MAX_CHARS
    assert result.text or result.note.startswith("[no readable text found")


def test_converting_touches_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the conversion tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for saved in sorted(SAVED.glob("*.html")):
        assert readable(saved.read_text(encoding="utf-8"), URL, FETCH_MAX_CHARS).converter


def test_prose_loses_markdowns_escapes_and_code_keeps_its_backslashes() -> None:
    page = readable("<html><body><article><p>Set max_connections to *50* in "
                    "&lt;config&gt;, or match <code>a\\*b</code>.</p><p>" + "More words. " * 30
                    + "</p></article></body></html>", URL, FETCH_MAX_CHARS)
    # (trafilatura 2.0 puts a break after an inline code span: the span is what is checked)
    assert "Set max_connections to *50* in <config>, or match `a\\*b`" in page.text
