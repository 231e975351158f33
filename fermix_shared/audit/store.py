"""The audit log in Redis: append, read, verify, trim and export.

Three keys under the hash tag ``{audit}`` (fermix_shared/keys.py): ``head`` (the newest
entry's seq and hash), ``entries`` (seq -> entry JSON) and ``anchor`` (the last entry
retention dropped). An append is one EVALSHA of ``audit_append.lua``, which reads the head,
assigns seq and time, computes the link hash in Lua (sha256 is implemented there: Redis has no
builtin) and writes the entry and the new head: concurrent appenders on any number of hosts
are serialized by Redis itself, with no retries and no lost links. Reads page through
``entries`` by seq with HMGET.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from fermix_shared import keys, lua
from fermix_shared.audit.chain import canonical_json, sha256_hex
from fermix_shared.audit.model import AuditConfig, AuditEntry
from fermix_shared.audit.verify import ChainPoint, Verified, verify
from fermix_shared.errors import FermixError

log = logging.getLogger(__name__)

# Entries read per round trip.
PAGE = 500
# A filtered read (``recent`` with agent or run) looks at most this many of the newest entries.
MAX_SCAN = 50_000
# Retention drops at most this many entries per script call (a short script), and makes at
# most TRIM_CALLS calls per reaper scan; a backlog is worked off over a few scans.
TRIM_BATCH = 500
TRIM_CALLS = 20


@dataclass(frozen=True)
class Appended:
    """Where an append landed."""

    seq: int
    ts: int
    hash: str


def _append_values(body: Mapping[str, Any]) -> dict[str, lua.Arg]:
    text = canonical_json(body)
    detail = body.get("detail")
    refusal = isinstance(detail, Mapping) and detail.get("refusal") is True
    return {"head": keys.audit_head(), "entries": keys.audit_entries(), "body": text,
            "digest": sha256_hex(text), "refusal": "1" if refusal else "0"}


def append(r: redis.Redis, body: Mapping[str, Any]) -> Appended:
    """Append one entry (``body``: no header fields). Raises on a Redis error."""
    seq, ts, h = lua.AUDIT_APPEND(r, **_append_values(body))
    return Appended(int(seq), int(ts), str(h))


async def append_async(r: aioredis.Redis, body: Mapping[str, Any]) -> Appended:
    """:func:`append` for the gateway's asyncio client."""
    seq, ts, h = await lua.AUDIT_APPEND(r, **_append_values(body))
    return Appended(int(seq), int(ts), str(h))


def _point(raw: Mapping[Any, Any]) -> ChainPoint | None:
    if not raw or "seq" not in raw:
        return None
    return ChainPoint(int(raw["seq"]), str(raw.get("hash", "")))


def parse_entry(raw: str | bytes | None) -> AuditEntry | None:
    """A stored entry, or None when it is missing or unreadable (verify says which)."""
    if raw is None:
        return None
    try:
        return AuditEntry.model_validate_json(raw)
    except (ValidationError, ValueError):
        return None


def matches(entry: AuditEntry, agent: str | None, run: str | None) -> bool:
    return (not agent or entry.agent == agent) and (not run or entry.run == run)


def _pages(top: int, bottom: int) -> Iterator[list[str]]:
    """Sequence numbers from ``top`` down to ``bottom + 1``, newest first, a page at a time."""
    seq = top
    while seq > bottom:
        low = max(bottom, seq - PAGE)
        yield [str(s) for s in range(seq, low, -1)]
        seq = low


class AuditLog:
    """Reads and maintenance over a synchronous client (CLI, workers, tests)."""

    def __init__(self, r: redis.Redis):
        self._r = r

    def head(self) -> ChainPoint | None:
        """The newest entry's seq and hash; None before the first append."""
        return _point(self._r.hgetall(keys.audit_head()))

    def anchor(self) -> ChainPoint:
        """Where verification starts: the last entry trimmed away, else the origin."""
        return _point(self._r.hgetall(keys.audit_anchor())) or ChainPoint.origin()

    def raw(self, first: int, last: int) -> Iterator[str | None]:
        """Entries ``first``..``last`` as stored (None for a missing one), oldest first."""
        seq = first
        while seq <= last:
            upto = min(last, seq + PAGE - 1)
            fields = [str(s) for s in range(seq, upto + 1)]
            yield from self._r.hmget(keys.audit_entries(), fields)  # type: ignore[misc]
            seq = upto + 1

    def recent(self, *, agent: str | None = None, run: str | None = None,
               limit: int = 100) -> list[AuditEntry]:
        """The newest ``limit`` entries (of ``agent`` / ``run`` when given), newest first."""
        head = self.head()
        if head is None or limit <= 0:
            return []
        out: list[AuditEntry] = []
        bottom = max(self.anchor().seq, head.seq - MAX_SCAN)
        for page in _pages(head.seq, bottom):
            for raw in self._r.hmget(keys.audit_entries(), page):
                entry = parse_entry(raw)
                if entry is not None and matches(entry, agent, run):
                    out.append(entry)
                    if len(out) >= limit:
                        return out
        return out

    def verify(self) -> Verified:
        """Walk the whole chain from the anchor to the head. A trim that moves the anchor
        while this reads is not a break: the walk starts again from the new anchor."""
        for _ in range(3):
            anchor, head = self.anchor(), self.head() or ChainPoint.origin()
            result = verify(anchor, self.raw(anchor.seq + 1, head.seq), head)
            if result.ok or self.anchor() == anchor:
                return result
        return result

    def export(self, out: TextIO, since: int | None = None) -> tuple[int, int, int]:
        """Write the entries after ``since`` (default: all kept) as JSON Lines, exactly as
        stored; (count, first seq, last seq). ``fermix audit verify --file`` checks a file."""
        anchor, head = self.anchor(), self.head()
        if head is None:
            return 0, 0, 0
        first = max(anchor.seq, since or 0) + 1
        count = last = 0
        for seq, raw in enumerate(self.raw(first, head.seq), first):
            if raw is None:
                continue  # trimmed meanwhile, or deleted: verify reports a deletion
            out.write(raw + "\n")
            count += 1
            last = seq
        return (count, first, last) if count else (0, 0, 0)

    def trim(self, config: AuditConfig, now_ms: int | None = None) -> int:
        """Retention: drop what is past ``config``'s limits (bounded work per call; strangers'
        refusals are not counted against ``max_entries``, see ``audit_trim.lua``); the
        number dropped. A missing or unreadable oldest entry stops it (and is logged by the
        caller): the chain's evidence is never trimmed past a break."""
        if not config.max_entries and not config.max_age_days:
            return 0
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        min_ts = now_ms - int(config.max_age_days * 86_400_000) if config.max_age_days else 0
        total = 0
        for _ in range(TRIM_CALLS):
            dropped, _anchor, status = lua.AUDIT_TRIM(
                self._r, head=keys.audit_head(), entries=keys.audit_entries(),
                anchor=keys.audit_anchor(), max_entries=config.max_entries, min_ts_ms=min_ts,
                batch=TRIM_BATCH)
            total += int(dropped)
            if status != "ok":
                raise BrokenAnchor(int(_anchor) + 1)
            if int(dropped) < TRIM_BATCH:
                break
        return total


class BrokenAnchor(FermixError):  # noqa: N818 - a finding, reported by the reaper's log
    """Retention stopped at an entry that is missing or unreadable."""

    def __init__(self, seq: int):
        super().__init__(f"audit retention stopped at entry #{seq}: it is missing or unreadable "
                         "(run `fermix audit verify`)")
        self.seq = seq


async def recent_async(r: aioredis.Redis, *, agent: str | None = None, run: str | None = None,
                       limit: int = 100) -> list[AuditEntry]:
    """:meth:`AuditLog.recent` for the gateway's asyncio client."""
    head = _point(await r.hgetall(keys.audit_head()))
    if head is None or limit <= 0:
        return []
    anchor = _point(await r.hgetall(keys.audit_anchor())) or ChainPoint.origin()
    out: list[AuditEntry] = []
    for page in _pages(head.seq, max(anchor.seq, head.seq - MAX_SCAN)):
        for raw in await r.hmget(keys.audit_entries(), page):
            entry = parse_entry(raw)
            if entry is not None and matches(entry, agent, run):
                out.append(entry)
                if len(out) >= limit:
                    return out
    return out


def entry_json(entry: AuditEntry) -> dict[str, Any]:
    """An entry as the API and ``fermix audit tail --json`` show it."""
    return entry.model_dump(mode="json")


def apply_retention(r: redis.Redis, config: AuditConfig) -> int:
    """Retention, one bounded pass, as the fleet's sweep (``[audit] max_entries`` /
    ``max_age_days``): the entries dropped. Never raises: a broken anchor is logged as the
    finding it is, and an unreachable Redis waits for the next sweep."""
    try:
        return AuditLog(r).trim(config)
    except BrokenAnchor as e:
        log.error("%s", e)
    except redis.RedisError as e:
        log.warning("audit retention skipped this scan: %s", e)
    return 0
