"""OpenAI embeddings wire format (``POST /v1/embeddings``): deterministic vectors.

Each input becomes a hashed bag of words: every word (lower-cased, a plural ``s`` stripped)
adds 1 to the one of DIMENSIONS coordinates its SHA-256 picks, and the vector is scaled to
unit length. Texts that share words point the same way, so cosine similarity behaves like a
(crude) embedding model, the same on every run. Both encodings the SDK asks for are served:
``float`` (lists) and ``base64`` (little-endian float32, the SDK's default).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from typing import Any

DIMENSIONS = 256
_WORD_RE = re.compile(r"\w+")


def vector(text: str) -> list[float]:
    """The unit-length hashed bag of words of ``text`` (all zeros for a text of no words)."""
    out = [0.0] * DIMENSIONS
    for word in _WORD_RE.findall(text.casefold()):
        word = word[:-1] if len(word) > 3 and word.endswith("s") else word
        out[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % DIMENSIONS] += 1
    norm = math.sqrt(sum(x * x for x in out))
    return [x / norm for x in out] if norm else out


def inputs_of(body: dict[str, Any]) -> list[str]:
    """The texts to embed (``input``: a string or a list of strings). Raises ValueError
    for anything else, as the real API refuses it (token-id inputs are not served)."""
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("input must be a string or a non-empty list of strings")
    if any(not t for t in texts):
        raise ValueError("input must not contain empty strings")
    return texts


def render_response(body: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    """The ``list`` of ``embedding`` objects for ``texts``, in the requested encoding."""
    base64_wanted = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(texts):
        v = vector(text)
        encoded: Any = (base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
                        if base64_wanted else v)
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    tokens = sum(len(_WORD_RE.findall(t)) for t in texts)
    return {"object": "list", "data": data, "model": str(body.get("model") or "scripted"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
