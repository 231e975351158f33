"""Split a long reply into chunks under a platform's size limit, at natural boundaries."""

from __future__ import annotations

import re

_BOUNDARIES = ("\n\n", "\n", ". ", " ")


def chunk_text(text: str, limit: int) -> list[str]:
    """Chunks of at most ``limit`` characters, in order, cut at the last paragraph break, else
    line break, else sentence end, else space before the limit (a hard cut only for a run of
    ``limit`` characters with none). Whitespace at the cuts is dropped; nothing else is lost."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    text = text.strip()
    chunks: list[str] = []
    while len(text) > limit:
        window = text[: limit + 1]
        cut = -1
        for sep in _BOUNDARIES:
            at = window.rfind(sep, 0, limit + 1)
            if at > 0:
                cut = at + (1 if sep == ". " else 0)
                break
        if cut <= 0:
            cut = limit
        head, text = text[:cut].rstrip(), text[cut:].lstrip()
        if head:
            chunks.append(head)
    if text:
        chunks.append(text)
    return chunks


def visible_length(text: str) -> int:
    """Length without HTML tags (Telegram counts the rendered text against 4096)."""
    return len(re.sub(r"<[^>]+>", "", text))
