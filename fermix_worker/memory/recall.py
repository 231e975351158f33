"""Which remembered facts join a turn's prompt: the ``[memory] recall_top`` (5) most relevant
to the user's message, not the newest (the seed recalls "Top 5 most relevant").

With ``embedding_model`` set, relevance is the cosine similarity of the message's embedding
and each fact's. Fact vectors are cached in Redis by text
(:class:`~fermix_shared.memory.vectors.FactVectors`), so a turn makes one embeddings call:
its message, batched with any fact not embedded yet. Without an embedding model, for an
empty message, or when the call fails (logged; the turn goes on), BM25 full-text ranking
(:func:`~fermix_shared.memory.relevance.rank`), facts that share no word with the message
after those that do. With no more facts than ``recall_top``, all of them, and no call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import redis

from fermix_shared.errors import FermixError
from fermix_shared.memory import MAX_ACTIVE_FACTS, Fact, MemoryStore
from fermix_shared.memory.relevance import rank, rank_by_vector
from fermix_shared.memory.vectors import FactVectors
from fermix_shared.settings import Settings
from fermix_worker.providers.embeddings import Embedder, embedder_from_settings

log = logging.getLogger(__name__)

Ranking = Literal["embedding", "full_text", "all"]


@dataclass(frozen=True)
class Recalled:
    """The facts for the prompt, best first, and how they were chosen (for the audit)."""

    facts: list[Fact]
    ranking: Ranking


class MemoryRecall:
    """Chooses a turn's facts (module docstring)."""

    def __init__(self, store: MemoryStore, r: redis.Redis, settings: Settings):
        self._store, self._r, self._settings = store, r, settings

    def relevant(self, message: str, active_ids: Any = None) -> Recalled:
        """The ``recall_top`` active facts most relevant to ``message``, best first.
        ``active_ids``: ``ZREVRANGE keys.memory_active() 0 MAX_ACTIVE_FACTS-1`` as the caller
        read it (None: read here)."""
        top = self._settings.memory.recall_top
        facts = (self._store.active(MAX_ACTIVE_FACTS) if active_ids is None
                 else self._store.facts_of(active_ids))
        if len(facts) <= top:
            return Recalled(rank(message, facts, top, fill=True), "all")
        if self._settings.memory.embedding_model and message.strip():
            try:
                embedder = embedder_from_settings(self._settings)
                if embedder is not None:
                    return Recalled(self._by_embedding(embedder, message, facts, top),
                                    "embedding")
            except (FermixError, ValueError) as e:  # ValueError: a stored vector unreadable
                log.warning("memory recall: embeddings failed (%s); ranking by full text", e)
        return Recalled(rank(message, facts, top, fill=True), "full_text")

    def _by_embedding(self, embedder: Embedder, message: str, facts: list[Fact],
                      top: int) -> list[Fact]:
        cache = FactVectors(self._r, embedder.model)
        texts = [f.text for f in facts]
        known = cache.cached(texts)
        missing = sorted(set(texts) - known.keys())
        query, *fresh = embedder.embed([message, *missing])
        if missing:
            cache.save(dict(zip(missing, fresh, strict=True)), keep=texts)
        vectors = {**known, **dict(zip(missing, fresh, strict=True))}
        return rank_by_vector(query, facts, lambda f: vectors[f.text], top)
