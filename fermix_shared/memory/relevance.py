"""Deterministic recall ranking: token overlap plus a whole-phrase bonus. No embeddings, no
network, so the same query over the same facts always ranks them the same way."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

_WORD_RE = re.compile(r"\w+")
# Words that match nearly every fact and so say nothing about relevance.
_STOPWORDS = frozenset({
    "a", "about", "an", "and", "are", "as", "at", "be", "but", "by", "do", "does", "for",
    "from", "has", "have", "i", "in", "is", "it", "its", "me", "my", "of", "on", "or", "our",
    "so", "that", "the", "their", "them", "they", "this", "to", "was", "we", "were", "what",
    "when", "where", "which", "who", "why", "will", "with", "you", "your",
})


class Ranked(Protocol):
    """What ranking needs of a fact."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def updated_at(self) -> float: ...


F = TypeVar("F", bound=Ranked)


def tokens(text: str) -> set[str]:
    """Lower-cased word tokens without stopwords or single letters, plural ``s`` stripped."""
    out: set[str] = set()
    for word in _WORD_RE.findall(text.casefold()):
        if word in _STOPWORDS or (len(word) == 1 and word.isalpha()):  # the "s" of "dog's"
            continue
        out.add(word[:-1] if len(word) > 3 and word.endswith("s") else word)
    return out


def score(query: str, text: str) -> float:
    """Share of the query's tokens the text has (0..1), plus 1 when the whole query appears
    in the text as written (case-insensitive). 0 means unrelated."""
    wanted = tokens(query)
    if not wanted:
        return 0.0
    overlap = len(wanted & tokens(text)) / len(wanted)
    phrase = " ".join(query.split()).casefold()
    return overlap + (1.0 if phrase and phrase in text.casefold() else 0.0)


def rank(query: str, facts: Sequence[F], limit: int) -> list[F]:
    """The ``limit`` facts most relevant to ``query``, best first; ties go to the most
    recently updated. An empty (or stopword-only) query gives the most recent facts."""
    if limit <= 0:
        return []
    if not tokens(query):
        return sorted(facts, key=lambda f: (-f.updated_at, f.id))[:limit]
    scored = [(score(query, f.text), f) for f in facts]
    hits = [(s, f) for s, f in scored if s > 0]
    hits.sort(key=lambda sf: (-sf[0], -sf[1].updated_at, sf[1].id))
    return [f for _, f in hits[:limit]]
