"""The chain's arithmetic: canonical JSON, digests and the link hash. Pure, no Redis.

An entry is a body (who did what, with which outcome) plus four header fields the append
script assigns: ``seq``, ``ts`` (ms, Redis server time), ``prev`` (the previous entry's hash,
64 zeros for the first) and ``hash``::

    digest = sha256_hex(canonical_json(body))
    hash   = sha256_hex(f"{prev}\\n{seq}\\n{ts}\\n{digest}")

The caller hashes the body (any length, in Python); the script hashes only the short link
(about 150 bytes) in Lua, so an append costs the same Redis time whatever the entry holds.
Changing any body field changes ``digest``; changing a header breaks the link or the next
entry's ``prev``; deleting an entry leaves a gap in ``seq`` and a ``prev`` that links nowhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

GENESIS = "0" * 64
"""``prev`` of the first entry ever appended (and the anchor's hash before any trimming)."""
HEADER_FIELDS = frozenset({"seq", "ts", "prev", "hash"})
"""What the append script adds to a body; never a body field."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only (``\\uXXXX`` escapes), no NaN: one text per
    value, so a body read back and encoded again hashes the same."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def sha256_hex(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def body_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry without its header fields."""
    return {k: v for k, v in entry.items() if k not in HEADER_FIELDS}


def link_hash(prev: str, seq: int, ts: int, digest: str) -> str:
    """The hash an entry with this ``prev``, ``seq``, ``ts`` and body digest carries."""
    return sha256_hex(f"{prev}\n{seq}\n{ts}\n{digest}")


def entry_hash(entry: Mapping[str, Any]) -> str:
    """Recompute a stored entry's hash from its content."""
    digest = sha256_hex(canonical_json(body_of(entry)))
    return link_hash(str(entry["prev"]), int(entry["seq"]), int(entry["ts"]), digest)


def text_digest(text: str) -> str:
    """What an entry keeps of a text it must not hold (a message, an argument): its sha256."""
    return sha256_hex(text)


def arguments_digest(arguments: Mapping[str, Any] | Any) -> tuple[str, int]:
    """A tool call's arguments as (sha256 of their canonical JSON, its length): two calls with
    the same arguments match, and nothing of the values is kept."""
    try:
        text = canonical_json(arguments)
    except (TypeError, ValueError):  # not JSON (a NaN, an odd object): hash its repr instead
        text = repr(arguments)
    return sha256_hex(text), len(text)
