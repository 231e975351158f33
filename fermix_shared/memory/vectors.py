"""FactVectors: remembered facts' embeddings, cached in Redis so a turn embeds only its
message (and any fact not embedded yet).

One hash per embedding model (``keys.memory_vectors``). A field is the SHA-256 of a fact's
text, so a replaced fact gets a new vector and an unchanged one is never embedded twice; the
value is the vector as base64 little-endian float32 (a quarter of the size of JSON, and text,
so it reads the same over a ``decode_responses`` client).
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from fermix_shared import keys


def text_digest(text: str) -> str:
    """The field of a fact's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def encode(vector: Sequence[float]) -> str:
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def decode(raw: str | bytes) -> list[float]:
    """Raises ValueError for a value that is not base64 of float32s."""
    data = base64.b64decode(raw, validate=True)
    if len(data) % 4:
        raise ValueError("a stored vector is not a whole number of float32s")
    packed = array("f")
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()


class FactVectors:
    """The cached vectors of one embedding model."""

    def __init__(self, r: redis.Redis, model: str):
        self._r = r
        self._key = keys.memory_vectors(model)

    def cached(self, texts: Sequence[str]) -> dict[str, list[float]]:
        """text -> vector for those of ``texts`` already embedded."""
        if not texts:
            return {}
        raws: list[Any] = self._r.hmget(self._key, [text_digest(t) for t in texts])
        return {t: decode(raw) for t, raw in zip(texts, raws, strict=True) if raw is not None}

    def save(self, vectors: dict[str, Sequence[float]], keep: Iterable[str]) -> None:
        """Store ``vectors`` (text -> vector) and drop the fields of texts not in ``keep``
        (facts forgotten, replaced or archived since)."""
        wanted = {text_digest(t) for t in keep} | {text_digest(t) for t in vectors}
        stale = [f for f in self._r.hkeys(self._key)
                 if (f.decode() if isinstance(f, bytes) else f) not in wanted]
        pipe = self._r.pipeline(transaction=False)
        if vectors:
            pipe.hset(self._key, mapping={text_digest(t): encode(v) for t, v in vectors.items()})
        if stale:
            pipe.hdel(self._key, *stale)
        pipe.execute()
