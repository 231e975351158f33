"""Queue activity and worker liveness, read from the indexes the queue scripts maintain.

Read-only: two round trips (a MULTI snapshot of the two indexes and the worker hash, then the
inbox lengths), so the counts are consistent with each other but the inbox lengths may be a
few milliseconds younger than the indexes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fermix_shared import keys

# Conversations listed one by one; the counts always cover all of them.
DETAIL_LIMIT = 50


@dataclass(frozen=True)
class WorkerSeen:
    """A worker whose heartbeat is younger than ``keys.WORKER_SEEN_TTL_SECONDS``."""

    name: str
    last_seen_ago: float


@dataclass(frozen=True)
class ConversationActivity:
    """One conversation with an active turn or waiting messages.

    ``lease_expires_in`` is seconds until the active turn's lease lapses (negative when it has
    lapsed and the turn awaits recovery); None without an active turn.
    """

    conversation: str
    active: bool
    lease_expires_in: float | None
    pending: int


@dataclass(frozen=True)
class QueueStatus:
    """Fleet-wide queue activity: one active turn per conversation, messages waiting behind."""

    active_conversations: int
    pending_conversations: int
    active_requests: int
    pending_requests: int
    workers: tuple[WorkerSeen, ...]
    conversations: tuple[ConversationActivity, ...]


def _text(x: Any) -> str:
    """Redis replies as ``str`` whether or not the client decodes responses."""
    return x.decode() if isinstance(x, bytes) else str(x)


def _workers_seen(raw: dict[str, str], now: float) -> tuple[WorkerSeen, ...]:
    seen = []
    for name, value in raw.items():
        try:
            ago = max(0.0, now - float(value))
        except ValueError:
            continue
        if ago <= keys.WORKER_SEEN_TTL_SECONDS:
            seen.append(WorkerSeen(name, round(ago, 1)))
    return tuple(sorted(seen, key=lambda w: w.name))


async def queue_status(r: aioredis.Redis, *, now: float | None = None) -> QueueStatus:
    """Counts over every conversation, detail for up to ``DETAIL_LIMIT`` of them.

    Detail lists active conversations first (soonest lease expiry first), then waiting ones
    (longest wait first). ``now`` (unix seconds) is for tests; the wall clock otherwise, as
    leases and heartbeats are written in wall-clock time.
    """
    now = time.time() if now is None else now
    snap = r.pipeline(transaction=True)
    snap.zrange(keys.active_index(), 0, -1, withscores=True)
    snap.zrange(keys.queued_index(), 0, -1)
    snap.hgetall(keys.workers())
    active_raw, queued_raw, workers_raw = await snap.execute()
    active: dict[str, float] = {_text(conv): float(until) for conv, until in active_raw}
    queued: list[str] = [_text(conv) for conv in queued_raw]

    shown = list(active)[:DETAIL_LIMIT]
    shown += [c for c in queued if c not in active][: DETAIL_LIMIT - len(shown)]
    counted = list(dict.fromkeys([*queued, *shown]))
    lengths = r.pipeline(transaction=False)
    for conv in counted:
        lengths.llen(keys.inbox(conv))
    pending: dict[str, int] = dict(zip(counted, map(int, await lengths.execute()), strict=True))

    return QueueStatus(
        active_conversations=len(active),
        pending_conversations=len(queued),
        # One active turn per conversation, so active requests and conversations agree.
        active_requests=len(active),
        pending_requests=sum(pending[c] for c in queued),
        workers=_workers_seen({_text(k): _text(v) for k, v in workers_raw.items()}, now),
        conversations=tuple(
            ConversationActivity(
                conversation=conv,
                active=conv in active,
                lease_expires_in=(
                    round(active[conv] / 1000 - now, 1) if conv in active else None
                ),
                pending=pending[conv],
            )
            for conv in shown
        ),
    )
