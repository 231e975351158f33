"""Recall ranking, deterministic: the same query over the same facts always ranks them the
same way.

Full text: Okapi BM25 over the facts as the corpus (a word most facts share, such as "user",
weighs little; a rare one much). By vector: cosine similarity between the query's embedding
and each fact's (the worker computes them, :mod:`fermix_worker.memory.recall`). Both pure.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
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


# BM25's usual constants: term-frequency saturation and length normalization.
_K1, _B = 1.2, 0.75


def terms(text: str) -> list[str]:
    """Lower-cased words in order, repeats kept, without stopwords or single letters,
    plural ``s`` stripped."""
    out: list[str] = []
    for word in _WORD_RE.findall(text.casefold()):
        if word in _STOPWORDS or (len(word) == 1 and word.isalpha()):  # the "s" of "dog's"
            continue
        out.append(word[:-1] if len(word) > 3 and word.endswith("s") else word)
    return out


def tokens(text: str) -> set[str]:
    """The distinct :func:`terms` of ``text``."""
    return set(terms(text))


def bm25(query: str, texts: Sequence[str]) -> list[float]:
    """Each text's Okapi BM25 score for the query's distinct terms, the texts being the
    corpus (so rarity is measured among them). 0 means no query term occurs in it."""
    wanted = tokens(query)
    docs = [Counter(terms(t)) for t in texts]
    if not wanted or not docs:
        return [0.0] * len(docs)
    lengths = [sum(d.values()) for d in docs]
    average = sum(lengths) / len(docs) or 1.0
    idf = {}
    for term in wanted:
        having = sum(1 for d in docs if term in d)
        idf[term] = math.log(1 + (len(docs) - having + 0.5) / (having + 0.5))
    scores = []
    for doc, length in zip(docs, lengths, strict=True):
        norm = _K1 * (1 - _B + _B * length / average)
        scores.append(sum(idf[t] * doc[t] * (_K1 + 1) / (doc[t] + norm)
                          for t in wanted if doc[t]))
    return scores


def _best(scored: list[tuple[float, F]], limit: int) -> list[F]:
    """Highest score first; ties go to the most recently updated."""
    scored.sort(key=lambda sf: (-sf[0], -sf[1].updated_at, sf[1].id))
    return [f for _, f in scored[:limit]]


def rank(query: str, facts: Sequence[F], limit: int, *, fill: bool = False) -> list[F]:
    """The ``limit`` facts most relevant to ``query`` by BM25, best first; ties go to the most
    recently updated. Facts sharing no term with the query are left out, unless ``fill``
    (a prompt's memory section: then they follow the matches, newest first). An empty (or
    stopword-only) query gives the most recent facts."""
    if limit <= 0:
        return []
    if not tokens(query):
        return sorted(facts, key=lambda f: (-f.updated_at, f.id))[:limit]
    scored = list(zip(bm25(query, [f.text for f in facts]), facts, strict=True))
    return _best([(s, f) for s, f in scored if fill or s > 0], limit)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors of one length (0 when either is all zeros).
    Raises ValueError when the lengths differ (vectors of two different models)."""
    if len(a) != len(b):
        raise ValueError(f"vectors of {len(a)} and {len(b)} dimensions")
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


def rank_by_vector(query: Sequence[float], facts: Sequence[F],
                   vector_of: Callable[[F], Sequence[float]], limit: int) -> list[F]:
    """The ``limit`` facts whose vectors are most similar to ``query``'s, best first; ties go
    to the most recently updated."""
    if limit <= 0:
        return []
    return _best([(cosine(query, vector_of(f)), f) for f in facts], limit)
