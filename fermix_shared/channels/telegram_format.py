"""Markdown as LLMs write it, rendered for Telegram (``parse_mode=HTML``) or as plain text.

Supported: ``**bold**``/``__bold__``, ``*italic*``/``_italic_``, ``~~strike~~``, ```` `code` ````,
fenced code blocks with an optional language, ``[links](url)`` and ``<url>``, ``#`` headings
(bold lines), ``-``/``*``/``+`` bullets (``•``), ``>`` quotes (``<blockquote>``) and backslash
escapes. Anything else (tables, images, raw HTML, an unmatched ``**``) stays as escaped text.
Every construct is rendered as a whole or not at all, so the output is always balanced HTML:
a chunk cut in the middle of ``**bold`` just shows the asterisks.

Telegram counts a message's visible text (tags removed, entities decoded, UTF-16 code units)
against 4096; :func:`telegram_length` measures that.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fermix_shared.channels.chunking import chunk_text

Mode = Literal["html", "plain"]

# Schemes Telegram turns into links; anything else stays text ("javascript:" never becomes one).
_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")

_INLINE = re.compile(
    r"(?P<esc>\\[\\`*_{}\[\]()#+\-.!~>|])"
    r"|(?P<code>(?<!`)(?P<ticks>`+)(?!`)(?P<code_body>.+?)(?<!`)(?P=ticks)(?!`))"
    r"|(?P<auto><(?P<auto_url>(?:https?|tg|mailto):[^\s<>]+)>)"
    r"|(?P<link>\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>(?:[^()\s]|\([^()\s]*\))+)"
    r"""(?:\s+"[^"\n]*")?\))"""
    r"|\*\*\*(?=\S)(?P<bold_italic>.+?)(?<=\S)\*\*\*"
    r"|\*\*(?=\S)(?P<bold>.+?)(?<=\S)\*\*"
    r"|(?<!\w)__(?=\S)(?P<bold_u>.+?)(?<=\S)__(?!\w)"
    r"|~~(?=\S)(?P<strike>.+?)(?<=\S)~~"
    r"|\*(?=[^\s*])(?P<italic>.+?)(?<=[^\s*])\*(?!\*)"
    r"|(?<![\w\\])_(?=[^\s_])(?P<italic_u>.+?)(?<=[^\s_])_(?!\w)"
)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<text>.*?)(?:[ \t]+#+)?[ \t]*$")
_BULLET = re.compile(r"^(?P<indent>[ \t]*)[-*+][ \t]+(?P<text>.*)$")
_QUOTE = re.compile(r"^ {0,3}> ?(?P<text>.*)$")
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
_LANG = re.compile(r"[\w+#.-]{1,32}")
_TAG = re.compile(r"<[^>]+>")

# Telegram's cap on one message's visible text, and the Markdown size we cut replies at: the
# headroom covers fences reopened per chunk and Markdown that renders longer than it reads.
TELEGRAM_MAX_LENGTH = 4096
MARKDOWN_CHUNK_LIMIT = 3800


@dataclass(frozen=True)
class CodeRegion:
    """A fenced code block: offsets into the Markdown and its opening line.

    ``start`` is where the opening line begins, ``body_start`` where the first code line begins,
    ``close_start``/``end`` where the closing line begins/ends (both ``len(md)`` if unclosed).
    ``opener`` is the opening line as written (indentation, fence and info string), ``fence``
    its backtick or tilde run, ``indent`` the opener's indentation.
    """

    start: int
    body_start: int
    close_start: int
    end: int
    opener: str
    fence: str
    indent: int
    lang: str | None


def code_regions(md: str) -> list[CodeRegion]:
    """The fenced code blocks of ``md``, in order. An unclosed fence runs to the end."""
    regions: list[CodeRegion] = []
    lines = md.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    i = 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i].rstrip("\r\n"))
        if m is None:
            i += 1
            continue
        fence = m["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not closing.match(lines[j].rstrip("\r\n")):
            j += 1
        info = m["info"].split()
        lang = info[0] if info and _LANG.fullmatch(info[0]) else None
        close_start = offsets[j] if j < len(lines) else len(md)
        end = offsets[j] + len(lines[j].rstrip("\r\n")) if j < len(lines) else len(md)
        regions.append(CodeRegion(offsets[i], offsets[i + 1], close_start, end,
                                  lines[i].rstrip("\r\n"), fence, len(m["indent"]), lang))
        i = j + 1
    return regions


def chunk_markdown(md: str, limit: int = MARKDOWN_CHUNK_LIMIT) -> list[str]:
    """``md`` cut into chunks of about ``limit`` characters (:func:`chunk_text` boundaries), each
    valid Markdown on its own: a code block cut in two is closed at the end of one chunk and
    reopened, with its language and the cut line's indentation, at the start of the next.
    Every chunk renders to at most 4096 visible characters, as HTML and as plain text; chunks
    that would render to nothing are dropped. Deterministic, so chunk indexes are stable."""
    regions = code_regions(md)
    chunks: list[str] = []
    pos = 0
    for piece in chunk_text(md, limit):
        # chunk_text only drops whitespace at its cuts, so each piece is found in order.
        start = md.find(piece, pos)
        end, prev_end, pos = start + len(piece), pos, start + len(piece)
        text = piece
        if (region := _region_around(regions, start)) is not None:
            if start < region.body_start:
                text = md[region.body_start:end] if end > region.body_start else ""
            else:
                # Restore the indentation chunk_text stripped from the cut code line.
                text = md[max(md.rfind("\n", 0, start) + 1, prev_end):end]
            text = f"{region.opener}\n{text}"
        if (region := _region_around(regions, end)) is not None:
            text += f"\n{region.opener[:region.indent]}{region.fence}"
        chunks.extend(_fit(text, limit))
    return chunks


def _region_around(regions: list[CodeRegion], at: int) -> CodeRegion | None:
    return next((r for r in regions if r.start < at < r.end), None)


def _fit(chunk: str, limit: int) -> list[str]:
    rendered, plain = to_telegram_html(chunk), strip_markdown(chunk)
    if not plain.strip() or not _TAG.sub("", rendered).strip():
        return []  # Telegram refuses an empty message
    too_long = (telegram_length(rendered) > TELEGRAM_MAX_LENGTH
                or telegram_length(plain, is_html=False) > TELEGRAM_MAX_LENGTH)
    if too_long and limit > 64:
        # Wide characters (emoji count twice in UTF-16) or markup that renders long.
        return chunk_markdown(chunk, limit // 2)
    return [chunk]


def to_telegram_html(md: str) -> str:
    """Telegram HTML for ``md``: balanced tags, ``& < >`` escaped everywhere outside them."""
    return _render(md, "html")


def strip_markdown(md: str) -> str:
    """``md`` as readable plain text (the fallback when Telegram refuses our HTML): markers
    removed, links as ``text (url)``, bullets as ``•``, quotes keep their ``>``."""
    return _render(md, "plain")


def telegram_length(rendered: str, *, is_html: bool = True) -> int:
    """What Telegram counts against 4096: visible text in UTF-16 code units."""
    text = html.unescape(_TAG.sub("", rendered)) if is_html else rendered
    return len(text.encode("utf-16-le")) // 2


def _render(md: str, mode: Mode) -> str:
    out: list[str] = []
    pos = 0
    for region in code_regions(md):
        _render_prose(_after_fence(md, pos, region.start), mode, out)
        _render_code(md[region.body_start:region.close_start], region, mode, out)
        pos = region.end
    _render_prose(_after_fence(md, pos, len(md)), mode, out)
    text = "\n".join(out)
    # Blank lines left where a code block or an empty construct stood are not worth sending.
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _after_fence(md: str, start: int, end: int) -> str:
    """Prose between ``start`` and ``end``, without the line break ending a closing fence."""
    text = md[start:end]
    if start > 0 and text.startswith(("\r\n", "\n")):
        return text[2:] if text.startswith("\r\n") else text[1:]
    return text


def _render_code(body: str, region: CodeRegion, mode: Mode, out: list[str]) -> None:
    lines = body.splitlines()
    if region.indent:
        # A fence indented under a list item: its code is indented as much; drop that.
        lines = [ln[region.indent:] if ln[:region.indent].isspace() else ln.lstrip()
                 for ln in lines]
    code = "\n".join(lines).strip("\n")
    if not code.strip():
        return
    if mode == "plain":
        out.append(code)
    elif region.lang:
        out.append(f'<pre><code class="language-{html.escape(region.lang)}">'
                   f"{_escape(code)}</code></pre>")
    else:
        out.append(f"<pre>{_escape(code)}</pre>")


def _render_prose(text: str, mode: Mode, out: list[str]) -> None:
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if _QUOTE.match(lines[i]):
            quoted: list[str] = []
            while i < len(lines) and (m := _QUOTE.match(lines[i])):
                # Telegram quotes cannot nest: a deeper ">" stays as text.
                quoted.append(_render_line(m["text"], mode))
                i += 1
            body = "\n".join(quoted).strip("\n")
            if mode == "plain":
                out.append("\n".join(f"> {ln}" if ln else ">" for ln in body.split("\n")))
            elif body:
                out.append(f"<blockquote>{body}</blockquote>")
            continue
        out.append(_render_line(lines[i], mode))
        i += 1


def _render_line(line: str, mode: Mode) -> str:
    if m := _HEADING.match(line):
        text = _inline(m["text"], mode)
        if mode == "plain" or not text:
            return text
        # The heading is bold already; our own tags are the only literal "<b>" in the output.
        return "<b>" + text.replace("<b>", "").replace("</b>", "") + "</b>"
    if m := _BULLET.match(line):
        return f"{m['indent']}• {_inline(m['text'], mode)}"
    return _inline(line, mode)


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _inline(text: str, mode: Mode, *, in_link: bool = False) -> str:
    esc: Callable[[str], str] = _escape if mode == "html" else (lambda s: s)

    def wrap(tag: str, inner: str) -> str:
        body = _inline(inner, mode, in_link=in_link)
        return body if mode == "plain" else f"<{tag}>{body}</{tag}>"

    parts: list[str] = []
    pos = 0
    for m in _INLINE.finditer(text):
        parts.append(esc(text[pos:m.start()]))
        pos = m.end()
        if m["esc"]:
            parts.append(esc(m["esc"][1]))
        elif m["code"]:
            body = m["code_body"]
            if len(body) > 2 and body[0] == " " and body[-1] == " ":
                body = body[1:-1]
            parts.append(body if mode == "plain" else f"<code>{_escape(body)}</code>")
        elif m["auto"] or m["link"]:
            url = m["auto_url"] or m["link_url"]
            label = m["link_text"] if m["link"] else url
            parts.append(_link(label, url, mode, in_link, m.group(0)))
        elif m["bold_italic"] is not None:
            inner = wrap("i", m["bold_italic"])
            parts.append(inner if mode == "plain" else f"<b>{inner}</b>")
        elif m["bold"] is not None or m["bold_u"] is not None:
            parts.append(wrap("b", m["bold"] or m["bold_u"]))
        elif m["strike"] is not None:
            parts.append(wrap("s", m["strike"]))
        else:
            parts.append(wrap("i", m["italic"] or m["italic_u"]))
    parts.append(esc(text[pos:]))
    return "".join(parts)


def _link(label: str, url: str, mode: Mode, in_link: bool, raw: str) -> str:
    if in_link or not url.lower().startswith(_LINK_SCHEMES):
        return _escape(raw) if mode == "html" else raw
    text = _inline(label, mode, in_link=True)
    if mode == "plain":
        return text if label == url else f"{text} ({url})"
    return f'<a href="{html.escape(url, quote=True)}">{text}</a>'
