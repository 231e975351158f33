"""A reply as Slack messages: standard Markdown in a ``markdown`` block, mrkdwn as its ``text``.

A reply is cut into Markdown pieces of at most :data:`MARKDOWN_LIMIT` (12,000) characters, Slack's
limit on a ``markdown`` block's text and on all the markdown blocks of one message together
(:func:`markdown_pieces`); each piece is one message, its block rendered by Slack (headings,
tables, code blocks). The message's ``text``, what notifications and clients without blocks
show, is the piece as mrkdwn (:func:`fallback_text`), cut under Slack's advised 4,000 characters.

mrkdwn is not Markdown: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>``,

no headings, and ``&``, ``<``, ``>`` must be written as entities because ``<...>`` is Slack's
control syntax (links, ``<@U123>`` mentions, ``<!channel>`` broadcasts). We escape them
everywhere, code included: Slack decodes the entities for display inside code too, and a raw
``<!here>`` in a code span would still notify the channel. User and channel mentions the model
writes on purpose (``<@U123>``, ``<#C123>``) and ``<https://...>`` autolinks are kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from slack_sdk.models.blocks import MarkdownBlock

from fermix_shared.channels.chunking import chunk_text

# Slack advises under 4,000 characters of ``text`` per message; we cut the Markdown at
# CHUNK_LIMIT and, should escaping grow a chunk past MESSAGE_LIMIT, cut that chunk finer.
CHUNK_LIMIT = 3500
MESSAGE_LIMIT = 3900
# Slack's limit on a markdown block's text, and on the markdown blocks of one message together.
# We cut at PIECE_LIMIT, leaving room for the fence lines that close and reopen a code block.
MARKDOWN_LIMIT = MarkdownBlock.text_max_length  # 12,000
PIECE_LIMIT = MARKDOWN_LIMIT - 100
MORE = "\n…"  # ends a fallback text cut short (the block holds the whole piece)

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^()\s<>]+(?:\([^()\s]*\))?)>?(?:\s+\"[^\"]*\")?\s*\)")
_ANGLE = re.compile(r"<(?:(https?://[^\s<>|]+)(?:\|([^<>\n]*))?|([@#][A-Z0-9]+(?:\|[^<>\n]*)?))>")
_BOLD_ITALIC = re.compile(r"\*\*\*(?=\S)(.+?)(?<=\S)\*\*\*")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|(?<!\w)__(?=\S)(.+?)(?<=\S)__(?!\w)")
_ITALIC_STAR = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(?:\[( |x|X)\]\s+)?")
_RULE = re.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^(\s*)>\s?")
_ESCAPED = re.compile(r"\\([\\`*_~\[\]#+\-!|])")
_BOLD_MARK = "\x02"  # stands for Slack's "*" until italics are done, so they are not re-read


def escape(text: str) -> str:
    """Slack's three control characters as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(md: str) -> str:
    """One Markdown text as Slack mrkdwn (see the module docstring for the rules)."""
    out: list[str] = []
    fence: str | None = None
    for line in md.split("\n"):
        if fence is None and (opened := _opens(line)):
            fence = opened
            out.append("```")  # Slack has no syntax highlighting: the language is dropped
        elif fence is not None and _closes(line, fence):
            fence = None
            out.append("```")
        else:
            out.append(escape(line) if fence is not None else _line(line))
    if fence is not None:
        out.append("```")
    return "\n".join(out)


def markdown_pieces(md: str, limit: int = PIECE_LIMIT) -> list[str]:
    """The reply as the Markdown of its Slack messages, in order, each at most
    :data:`MARKDOWN_LIMIT` characters: cut at a paragraph, else line, break outside code
    blocks, else at a line break inside one (the fence closed at the end of the piece and
    reopened, with its info string, at the start of the next)."""
    return _fit(md, limit, MARKDOWN_LIMIT, _split_outside_code, lambda piece: piece)


def slack_chunks(md: str, limit: int = CHUNK_LIMIT, hard_limit: int = MESSAGE_LIMIT) -> list[str]:
    """The reply as mrkdwn texts, in order: Markdown chunked at ``limit`` with code fences
    cut across chunks closed and reopened, each converted to mrkdwn and under ``hard_limit``."""
    return _fit(md, limit, hard_limit, chunk_text, to_mrkdwn)


def fallback_text(piece: str) -> str:
    """A message's ``text`` for the Markdown ``piece`` its block shows: the piece as mrkdwn,
    cut to its first chunk (ending in ``…``) past :data:`MESSAGE_LIMIT` characters."""
    chunks = slack_chunks(piece, hard_limit=MESSAGE_LIMIT - len(MORE))
    return chunks[0] + MORE if len(chunks) > 1 else "".join(chunks)


def markdown_block(piece: str) -> dict[str, Any]:
    """Slack's ``markdown`` block showing the Markdown ``piece`` (1 to 12,000 characters)."""
    return MarkdownBlock(text=piece).to_dict()


def _fit(md: str, limit: int, hard_limit: int, split: Callable[[str, int], list[str]],
         render: Callable[[str], str]) -> list[str]:
    """``md`` split at ``limit``, fences repaired, each piece rendered; a piece whose rendering
    is over ``hard_limit`` is split again, finer."""
    out: list[str] = []
    for piece in repair_fences(split(md, limit)):
        rendered = render(piece)
        if len(rendered) > hard_limit and limit > 50:
            out.extend(_fit(piece, limit // 2, hard_limit, split, render))
        else:
            out.append(rendered)
    return out


def _split_outside_code(md: str, limit: int) -> list[str]:
    """Like :func:`~fermix_shared.channels.chunking.chunk_text`, but a cut in the second half of
    the window goes at its last paragraph break outside code blocks, else line break outside
    them, else line break inside one; only without any is it where ``chunk_text`` would cut."""
    text = md.strip()
    pieces: list[str] = []
    fence: str | None = None  # the marker of the code block open where ``text`` starts
    while len(text) > limit:
        cut = _line_cut(text[: limit + 1], limit, fence)
        head = text[:cut].rstrip() if cut else chunk_text(text, limit)[0]
        pieces.append(head)
        for line in head.split("\n"):
            fence = _fence_after(line, fence)
        text = text[len(head):].lstrip()
    if text:
        pieces.append(text)
    return pieces


def _line_cut(window: str, limit: int, fence: str | None) -> int | None:
    """Where :func:`_split_outside_code` cuts ``window`` (``fence``: the code block open at its
    start): the offset of a line break at least half of ``limit`` in, or None."""
    paragraph = line_break = in_code = None
    at = 0
    lines = window.split("\n")
    for line, following in zip(lines, [*lines[1:], None], strict=True):
        fence = _fence_after(line, fence)
        at += len(line)
        if following is None or at > limit:
            break
        if at >= limit // 2 and line.strip():
            if fence is not None:
                in_code = at
            else:
                line_break = at
                paragraph = at if not following.strip() else paragraph
        at += 1  # the newline
    return paragraph or line_break or in_code


def repair_fences(chunks: list[str]) -> list[str]:
    """Close a code fence left open at the end of a chunk and reopen it (with its info string)
    at the start of the next, so every chunk renders on its own."""
    repaired: list[str] = []
    fence: str | None = None  # the open fence's marker (```` ``` ```` or ``~~~``)
    opener = ""  # the line that opened it, e.g. "```python"
    for chunk in chunks:
        text = f"{opener}\n{chunk}" if fence else chunk
        for line in chunk.split("\n"):
            if fence is None and _opens(line):
                opener = line.strip()
            fence = _fence_after(line, fence)
        repaired.append(f"{text}\n{fence}" if fence else text)
    return repaired


def _fence_after(line: str, fence: str | None) -> str | None:
    """The code block open after ``line`` (its fence marker), ``fence`` being open before."""
    if fence is None:
        return _opens(line)
    return None if _closes(line, fence) else fence


def _opens(line: str) -> str | None:
    """The fence marker if ``line`` opens a fenced code block."""
    m = _FENCE.match(line)
    return m.group(1) if m else None


def _closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes the block opened with ``fence`` (same char, at least as long,
    nothing after it)."""
    m = _FENCE.match(line)
    if not m or m.group(1)[0] != fence[0] or len(m.group(1)) < len(fence):
        return False
    return not line.strip().lstrip(fence[0]).strip()


def _line(line: str) -> str:
    """One line outside code blocks: block syntax first, then inline."""
    if _RULE.match(line):
        return "──────────"
    if m := _HEADING.match(line):
        inner = _BOLD.sub(_bold_inner, m.group(1))
        return f"*{_inline(inner)}*" if inner else ""
    prefix = ""
    if m := _QUOTE.match(line):  # Slack's quote marker is a literal ">" at line start
        prefix, line = f"{m.group(1)}>", line[m.end():]
        prefix += " " if line else ""
    if m := _BULLET.match(line):
        box = {" ": "☐ ", "x": "☑ ", "X": "☑ "}.get(m.group(2) or "", "")
        prefix, line = f"{prefix}{m.group(1)}• {box}", line[m.end():]
    return prefix + _inline(line)


def _inline(text: str) -> str:
    """Inline Markdown to mrkdwn; code spans and links are set aside first, then restored."""
    held: list[str] = []

    def hold(rendered: str) -> str:
        held.append(rendered)
        return f"\x00{len(held) - 1}\x00"

    def code(m: re.Match[str]) -> str:
        return hold(f"`{escape(m.group(2).strip() if m.group(1) != '`' else m.group(2))}`")

    def link(m: re.Match[str]) -> str:
        label = _plain(m.group(1)).replace("|", "¦")
        url = escape(m.group(2))
        return hold(f"<{url}|{escape(label)}>" if label and label != m.group(2) else f"<{url}>")

    def angle(m: re.Match[str]) -> str:
        if m.group(3):  # <@U123> / <#C123>: a mention the model meant
            return hold(m.group(0))
        url, label = escape(m.group(1)), m.group(2)
        return hold(f"<{url}|{escape(label)}>" if label else f"<{url}>")

    text = _INLINE_CODE.sub(code, text)
    text = _ESCAPED.sub(lambda m: hold(escape(m.group(1))), text)
    text = _LINK.sub(link, text)
    text = _ANGLE.sub(angle, text)
    text = escape(text)
    text = _BOLD_ITALIC.sub(rf"{_BOLD_MARK}_\1_{_BOLD_MARK}", text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{_bold_inner(m)}{_BOLD_MARK}", text)
    text = _ITALIC_STAR.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = text.replace(_BOLD_MARK, "*")
    return re.sub(r"\x00(\d+)\x00", lambda m: held[int(m.group(1))], text)


def _plain(text: str) -> str:
    """A link label without Markdown emphasis (Slack does not format inside link labels)."""
    text = _BOLD.sub(_bold_inner, text)
    text = _ITALIC_STAR.sub(r"\1", text)
    return _INLINE_CODE.sub(r"\2", text)


def _bold_inner(m: re.Match[str]) -> str:
    return m.group(1) if m.group(1) is not None else m.group(2)
