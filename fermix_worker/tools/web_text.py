"""Readable text of a fetched HTML page: Markdown with its links, its title, bounded.

:func:`readable` picks the converter. trafilatura finds the page's main content and leaves out
navigation, sidebars, footers, forms, scripts and styles. Where it finds nothing (a page with
hardly any text), or only the bare words of a page of links (a nav or index page: it keeps the
link texts and drops where they point, and there the links are the content), html2text renders
the whole body instead, its links kept. Relative links are then made absolute against the
page's URL (trafilatura, given the URL, joins ``../x`` against the site's root, so it is not
given one).

Both converters run in this process on the HTML already read (at most the fetch's byte bound)
and neither touches the network. A page built to blow the conversion up (a list nested
thousands deep indents every line, so its Markdown grows with the square of its HTML) stops
html2text at :data:`CONVERT_MAX_CHARS`; that, or anything a converter raises, counts as that
converter finding nothing.
"""

from __future__ import annotations

import html
import logging
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urljoin

import html2text

from fermix_shared.errors import FermixError

log = logging.getLogger(__name__)
# trafilatura logs what it thinks of a page ("not valid HTML") at ERROR: about the page, not
# the worker, and the fallback takes over; keep it out of the worker's log.
logging.getLogger("trafilatura").setLevel(logging.CRITICAL)

# Markdown html2text may write for one page before it is stopped: five times the fetch's byte
# bound (200 KB), far above what an ordinary page of that size turns into.
CONVERT_MAX_CHARS = 1_000_000
TITLE_MAX_CHARS = 300

Converter = Literal["trafilatura", "html2text"]

# `[text](target` of a Markdown link or image: the text, and the target up to a space or `)`.
_LINK = re.compile(r"(!?\[([^\]\n]*)\]\()([^)\s]+)")
# A heading's permalink (`## Overview[¶](#overview)` in Sphinx and MkDocs sites): noise.
_PERMALINK = re.compile(r"\[[¶§#]\]\([^)\s]*\)")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
_HEAD_END = re.compile(r"</head\s*>|<body[\s>]", re.IGNORECASE)
_MARKERS = "#*-+>0123456789. \t"  # what Markdown puts before a heading's or list item's text
# trafilatura's backslash before `*`, `_`, `~`, a backtick or `<` in prose (`snake\_case`), and
# the code blocks and spans in which a backslash is the code's own, matched first to be kept.
_ESCAPE = re.compile(r"(```.*?```|`[^`\n]*`)|\\([*_~<`])", re.DOTALL)


@dataclass(frozen=True)
class Readable:
    """A page as the model reads it: its title (if it has one) and its text, or the window of
    it asked for, with a note saying what was left out ("" when nothing was)."""

    title: str | None
    text: str
    note: str
    converter: Converter | None  # None: neither converter found any text


def page_title(page: str) -> str | None:
    """The text of the page's ``<title>`` (in its head, not an icon's in the body), unescaped,
    on one line, at most TITLE_MAX_CHARS."""
    end = _HEAD_END.search(page)
    match = _TITLE.search(page, 0, end.start() if end else len(page))
    title = " ".join(html.unescape(match[1]).split()) if match else ""
    return title[:TITLE_MAX_CHARS] or None


def readable(page: str, url: str, max_chars: int, offset: int = 0) -> Readable:
    """The page's HTML as Markdown (see the module docstring), its links absolute against
    ``url``: the :func:`window` of it from ``offset``, at most ``max_chars``, with its note."""
    title = page_title(page)
    markdown = to_markdown(page)
    if markdown is None:
        return Readable(title, "", "[no readable text found in this HTML: the page may be built "
                        "by JavaScript; raw=true returns its HTML]", None)
    converter, text = markdown
    shown, note = window(absolute_links(_PERMALINK.sub("", text), url), offset, max_chars)
    return Readable(title, shown, note, converter)


def window(text: str, offset: int, max_chars: int) -> tuple[str, str]:
    """``text[offset:end]``, at most ``max_chars``, and a note saying where it lies in
    ``text`` ("" when it is the whole text).

    Unless it reaches the end, the piece ends after the last line end in its last quarter
    (mid-line where there is none), and the note names ``end``, the offset to ask for next.
    The pieces are exact slices, so a reader paging from 0 with each note's offset gets the
    whole text back, no character lost or doubled.
    """
    if offset == 0 and len(text) <= max_chars:
        return text, ""
    if offset >= len(text):
        return "", f"[offset={offset} is past the end: the text has {len(text):,} characters]"
    piece = text[offset:offset + max_chars]
    if offset + len(piece) < len(text):
        line_end = piece.rfind("\n")
        if line_end >= max_chars * 3 // 4:
            piece = piece[:line_end + 1]
    end = offset + len(piece)
    span = f"characters {offset:,}-{end:,} of {len(text):,}"
    if end == len(text):
        return piece, f"[{span}: the end of the text]"
    return piece, f"[truncated: {span}; call again with offset={end} for more]"


def to_markdown(page: str) -> tuple[Converter, str] | None:
    """The converter that fits the page and its Markdown (links as in the HTML), or None when
    neither finds any text."""
    main = _converted("trafilatura", page)
    if main:
        # The model reads the text, not a rendering of it: the escapes are noise to it, and
        # `\</untrusted\_tool\_result>` would slip past the fence's defanging as a tag.
        main = _ESCAPE.sub(lambda m: m[1] or m[2], main)
    if main and _LINK.search(main):
        return "trafilatura", main
    whole = _converted("html2text", page)
    if main and not (whole and _lost_links(main, whole)):
        return "trafilatura", main
    return ("html2text", whole) if whole else None


def absolute_links(markdown: str, base: str) -> str:
    """``markdown`` with the target of every link and image joined to ``base``."""
    return _LINK.sub(lambda m: m[1] + urljoin(base, m[3]), markdown)


def _bare(line: str) -> str:
    return line.strip().lstrip(_MARKERS).strip()


def _lost_links(main: str, whole: str) -> bool:
    """True when trafilatura's text (which has no link) is mostly lines that are link texts
    in html2text's rendering of the whole page: it kept a list of links without their links."""
    link_texts = {_bare(m[2]) for m in _LINK.finditer(whole)}
    lines = [_bare(line) for line in main.splitlines() if line.strip()]
    return sum(line in link_texts for line in lines) * 2 > len(lines)


def _converted(converter: Converter, page: str) -> str | None:
    try:
        text = _main_content(page) if converter == "trafilatura" else _whole_body(page)
    except Exception as e:  # a converter failing on hostile HTML must not fail the fetch
        log.info("http_fetch: %s could not convert the page: %s: %s", converter,
                 type(e).__name__, e)
        return None
    return text.strip() if text else None


def _main_content(page: str) -> str | None:
    # Imported here: trafilatura takes ~140 ms to import, paid by the first HTML fetch
    # rather than by every worker start.
    import trafilatura
    from lxml import etree

    tree = trafilatura.load_html(page)
    if tree is None:
        return None
    # trafilatura drops <time> elements whole (as a byline's date), and with them the dates
    # of tables and lists; keep their text.
    etree.strip_tags(tree, "time")
    return trafilatura.extract(tree, output_format="markdown", include_links=True,
                               include_tables=True, deduplicate=False)


class _TooLong(FermixError):
    """html2text wrote more than CONVERT_MAX_CHARS (hostile nesting): give up on it."""


class _BoundedHTML2Text(html2text.HTML2Text):
    """html2text that raises :class:`_TooLong` once it has written CONVERT_MAX_CHARS."""

    def __init__(self) -> None:
        super().__init__(bodywidth=0)
        self.ignore_images = True
        self.unicode_snob = True  # keep “quotes” and non-ASCII letters as they are
        self._written = 0

    def outtextf(self, s: str) -> None:
        self._written += len(s)
        if self._written > CONVERT_MAX_CHARS:
            raise _TooLong(f"more than {CONVERT_MAX_CHARS:,} characters of Markdown")
        super().outtextf(s)


def _whole_body(page: str) -> str:
    return _BoundedHTML2Text().handle(page)
