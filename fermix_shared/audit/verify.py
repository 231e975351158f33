"""Verifying a run of entries against the chain: pure, so it checks Redis and an exported
JSON Lines file alike.

From the anchor (the last entry trimmed away, or seq 0 and :data:`GENESIS`), each entry must
be there and readable, carry the next ``seq``, link to the previous entry's hash (``prev``)
and hash to what it says (``hash``). The first entry that does not is reported; nothing after
it is trusted. With the head given, the last entry must be the head (nothing cut off the end).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from fermix_shared.audit.chain import GENESIS, entry_hash

Problem = Literal["missing", "unreadable", "seq mismatch", "prev mismatch", "hash mismatch",
                  "head mismatch"]


@dataclass(frozen=True)
class ChainPoint:
    """A position in the chain: the anchor, or the head (the newest entry)."""

    seq: int
    hash: str

    @classmethod
    def origin(cls) -> ChainPoint:
        return cls(0, GENESIS)


@dataclass(frozen=True)
class Break:
    """The first entry that does not verify, and why."""

    seq: int
    problem: Problem
    detail: str

    def describe(self) -> str:
        return f"entry #{self.seq}: {self.problem}: {self.detail}"


@dataclass(frozen=True)
class Verified:
    """``count`` entries verified, ``first``..``last`` (0, 0 when none); ``broken`` is the
    first that did not (the count stops before it)."""

    anchor: ChainPoint
    count: int
    first: int
    last: int
    last_hash: str
    broken: Break | None = None

    @property
    def ok(self) -> bool:
        return self.broken is None

    def describe(self) -> str:
        if self.broken is not None:
            return f"audit chain BROKEN at {self.broken.describe()}"
        trimmed = f", earlier ones trimmed (anchor #{self.anchor.seq})" if self.anchor.seq else ""
        if self.count == 0:
            return f"audit chain OK: 0 entries{trimmed}"
        return (f"audit chain OK: {self.count} entries from #{self.first} to #{self.last}"
                f"{trimmed}; head hash {self.last_hash}")


def _short(h: object) -> str:
    return f"{str(h)[:12]}…"


def verify(anchor: ChainPoint, entries: Iterable[str | dict[str, Any] | None],
           head: ChainPoint | None = None) -> Verified:
    """Walk ``entries`` (in order, the first one expected at ``anchor.seq + 1``; ``None`` for
    one that is not there; raw JSON or already parsed) from ``anchor``."""
    prev, seq, count = anchor.hash, anchor.seq, 0

    def result(broken: Break | None = None) -> Verified:
        first = anchor.seq + 1 if count else 0
        return Verified(anchor, count, first, seq if count else 0, prev, broken)

    for raw in entries:
        want = seq + 1
        if raw is None:
            return result(Break(want, "missing", "no entry with this sequence number"))
        try:
            entry = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(entry, dict):
                raise ValueError("not a JSON object")
            stated, entry_seq = entry.get("hash"), int(entry["seq"])
            computed = entry_hash(entry)
        except (ValueError, KeyError, TypeError) as e:
            return result(Break(want, "unreadable", f"{type(e).__name__}: {e}"))
        if entry_seq != want:
            return result(Break(want, "seq mismatch", f"it says it is #{entry_seq}"))
        if entry.get("prev") != prev:
            linked = f"entry #{seq}" if seq > anchor.seq else f"the anchor (#{seq})"
            return result(Break(want, "prev mismatch", (
                f"its prev is {_short(entry.get('prev'))}, but {linked} is {_short(prev)}")))
        if stated != computed:
            return result(Break(want, "hash mismatch", (
                f"its content hashes to {_short(computed)}, but it says {_short(stated)}: the "
                "entry was changed after it was written")))
        prev, seq, count = computed, want, count + 1
    if head is not None and head.seq > seq:
        return result(Break(seq + 1, "head mismatch", (
            f"the head is #{head.seq}, the chain ends at #{seq}: entries were cut off the end")))
    if head is not None and (head.seq != seq or head.hash != prev):
        return result(Break(seq, "head mismatch", (
            f"the head says #{head.seq} is {_short(head.hash)}, the chain's #{seq} is "
            f"{_short(prev)}: the end of the chain was rewritten")))
    return result()
