"""MemoryStore: the agent's long-term facts in Redis.

Memory is global to the agent (one agent per deployment), never per conversation: ``/new``
deletes a conversation's history and nothing here. Each fact is one JSON :class:`Fact` in a
hash; the active ones are indexed by change order and by their normalized text (so a repeat,
whatever its case or spacing, is the same fact). Every change that touches several keys is one
Lua script (``fermix_shared/lua/memory_*.lua``).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from fermix_shared import keys, lua
from fermix_shared.memory.fact import (
    MAX_ACTIVE_FACTS,
    MAX_ARCHIVED_FACTS,
    MAX_FORGET_AT_ONCE,
    Fact,
    MemoryRefused,
    clean,
    normalized,
)
from fermix_shared.memory.relevance import rank

_CAS_ATTEMPTS = 5


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MemoryStore:
    """The agent's facts over one Redis client (``decode_responses`` either way)."""

    def __init__(self, r: redis.Redis, *, max_active: int = MAX_ACTIVE_FACTS):
        self._r = r
        self._max_active = max_active

    def add_fact(self, text: str, source: str) -> tuple[Fact, bool]:
        """Store ``text`` as an active fact; ``(fact, True)`` if new, ``(existing, False)``
        when an active fact already says it. Raises MemoryRefused (bad text, memory full)."""
        text = clean(text)
        now, seq = time.time(), self._seq()
        fact = Fact(id=f"m{seq}", text=text, created_at=now, updated_at=now, source=source)
        kind, payload = (_str(x) for x in lua.MEMORY_ADD(
            self._r, facts=keys.memory_facts(), active=keys.memory_active(),
            text_index=keys.memory_text_index(), fact_id=fact.id, fact=fact.model_dump_json(),
            text=normalized(text), change=seq, max_active=self._max_active,
        ))
        if kind == "full":
            raise MemoryRefused(
                f"memory is full ({self._max_active} facts); forget or replace one first"
            )
        if kind == "dup":
            return Fact.model_validate_json(payload), False
        return fact, True

    def add(self, text: str, source: str) -> Fact:
        """Store ``text`` (see :meth:`add_fact`); a repeat returns the existing fact."""
        return self.add_fact(text, source)[0]

    def get(self, fact_id: str) -> Fact | None:
        read = self._read(fact_id)
        return None if read is None else read[0]

    def replace(self, fact_id: str, text: str) -> Fact:
        """Give an active fact new text. When another active fact already says it, this one
        is archived and that one returned. Raises MemoryRefused (unknown/archived, bad text)."""
        text = clean(text)
        for _ in range(_CAS_ATTEMPTS):
            old, raw = self._active_fact(fact_id)
            new = old.model_copy(update={"text": text, "updated_at": time.time()})
            outcome = self._update(raw, old, new)
            if outcome == "ok":
                return new
            if outcome == "dup":
                owner = self._r.hget(keys.memory_text_index(), normalized(text))
                self.archive(fact_id)
                found = None if owner is None else self.get(_str(owner))
                if found is not None:
                    return found
        raise MemoryRefused(f"fact {fact_id} kept changing; try again")

    def archive(self, fact_id: str) -> Fact:
        """Retire a fact: it leaves prompts and recall but is kept (up to a cap). Archiving
        an archived fact does nothing. Raises MemoryRefused for an unknown id."""
        for _ in range(_CAS_ATTEMPTS):
            read = self._read(fact_id)
            if read is None:
                raise MemoryRefused(f"there is no fact {fact_id}")
            old, raw = read
            if old.status == "archived":
                return old
            new = old.model_copy(update={"status": "archived", "updated_at": time.time()})
            if self._update(raw, old, new) == "ok":
                return new
        raise MemoryRefused(f"fact {fact_id} kept changing; try again")

    def forget(self, *, fact_id: str | None = None, query: str | None = None) -> list[Fact]:
        """Delete for good the fact ``fact_id``, or the active facts whose text contains
        ``query`` (case-insensitive; refused when more than MAX_FORGET_AT_ONCE match, so a
        vague query cannot wipe memory). Returns what was deleted."""
        if fact_id:
            fact = self.get(fact_id)
            targets = [] if fact is None else [fact]
        else:
            needle = " ".join((query or "").split()).casefold()
            if not needle:
                raise MemoryRefused("give the id of a fact, or a query its text contains")
            targets = [f for f in self.active(self._max_active) if needle in f.text.casefold()]
            if len(targets) > MAX_FORGET_AT_ONCE:
                ids = ", ".join(f.id for f in targets)
                raise MemoryRefused(f"{len(targets)} facts match ({ids}); forget them by id")
        return [f for f in targets if lua.MEMORY_DELETE(self._r, **self._all_keys(), fact_id=f.id,
                                                        text=normalized(f.text))]

    def active(self, limit: int = 200) -> list[Fact]:
        """The ``limit`` most recently updated active facts, oldest first."""
        if limit <= 0:
            return []
        return self.facts_of(self._r.zrevrange(keys.memory_active(), 0, limit - 1))

    def facts_of(self, newest_first: Any) -> list[Fact]:
        """:meth:`active` over the ids ``ZREVRANGE keys.memory_active() 0 limit-1`` read."""
        ids = [_str(i) for i in newest_first]
        if not ids:
            return []
        raws = self._r.hmget(keys.memory_facts(), list(reversed(ids)))
        return [Fact.model_validate_json(_str(raw)) for raw in raws if raw is not None]

    def recall(self, query: str, limit: int = 10) -> list[Fact]:
        """The active facts most relevant to ``query``, best first (see ``relevance``)."""
        return rank(query, self.active(self._max_active), limit)

    def _read(self, fact_id: str) -> tuple[Fact, str] | None:
        """The fact and its stored JSON (the expected value of a compare-and-set)."""
        raw = self._r.hget(keys.memory_facts(), fact_id)
        return None if raw is None else (Fact.model_validate_json(_str(raw)), _str(raw))

    def _active_fact(self, fact_id: str) -> tuple[Fact, str]:
        read = self._read(fact_id)
        if read is None:
            raise MemoryRefused(f"there is no fact {fact_id}")
        if read[0].status != "active":
            raise MemoryRefused(f"fact {fact_id} is archived")
        return read

    def _update(self, raw: str, old: Fact, new: Fact) -> str:
        return _str(lua.MEMORY_UPDATE(
            self._r, **self._all_keys(), fact_id=old.id, expected=raw, fact=new.model_dump_json(),
            old_text=normalized(old.text), new_text=normalized(new.text), status=new.status,
            change=self._seq(), max_archived=MAX_ARCHIVED_FACTS,
        ))

    def _seq(self) -> int:
        """The next number of the store's one sequence: fact ids and the order of changes
        (milliseconds would tie, and ``m10`` sorts before ``m9``)."""
        return int(self._r.incr(keys.memory_seq()))

    @staticmethod
    def _all_keys() -> dict[str, lua.Arg]:
        return {"facts": keys.memory_facts(), "active": keys.memory_active(),
                "archived": keys.memory_archived(), "text_index": keys.memory_text_index()}
