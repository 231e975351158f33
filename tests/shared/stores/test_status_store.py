"""The status store, checked exactly against index keys written by hand (db 10).

``queue_status`` reads what the queue scripts maintain; here nothing runs but Redis, so every
number is known in advance.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.stores.status import ConversationActivity, QueueStatus, WorkerSeen, queue_status

NOW = 1_700_000_000.0
NOW_MS = int(NOW * 1000)


@pytest.fixture
def private_db(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = redis_url.rsplit("/", 1)[0] + "/10"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.flushdb()
    r.close()


def status_of(url: str, now: float = NOW) -> QueueStatus:
    async def read() -> QueueStatus:
        r = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            return await queue_status(r, now=now)
        finally:
            await r.aclose()

    return asyncio.run(read())


def fill(r: redis.Redis, conv: str, n: int) -> None:
    r.rpush(keys.inbox(conv), *(json.dumps({"n": i}) for i in range(n)))


def test_an_idle_fleet_reports_zeros(private_db: tuple[str, redis.Redis]) -> None:
    url, _ = private_db
    assert status_of(url) == QueueStatus(0, 0, 0, 0, workers=(), conversations=())


def test_queue_status_counts_the_indexes_exactly(private_db: tuple[str, redis.Redis]) -> None:
    url, r = private_db
    a, b, c = "http|a|root", "http|b|root", "telegram|42|topic-7"
    r.zadd(keys.active_index(), {a: NOW_MS + 25_000, b: NOW_MS - 5_000})  # b's lease lapsed
    r.zadd(keys.queued_index(), {b: NOW_MS - 2_000, c: NOW_MS - 10_000})
    fill(r, b, 2)
    fill(r, c, 3)
    r.hset(keys.workers(), mapping={
        "w1@h": str(NOW - 3), "w2@h": str(NOW - 59.5), "gone@h": str(NOW - 120), "bad@h": "?",
    })

    assert status_of(url) == QueueStatus(
        active_conversations=2,
        pending_conversations=2,
        active_requests=2,
        pending_requests=5,
        workers=(WorkerSeen("w1@h", 3.0), WorkerSeen("w2@h", 59.5)),
        conversations=(
            ConversationActivity(b, active=True, lease_expires_in=-5.0, pending=2),
            ConversationActivity(a, active=True, lease_expires_in=25.0, pending=0),
            ConversationActivity(c, active=False, lease_expires_in=None, pending=3),
        ),
    )


def test_detail_is_capped_at_50_conversations_but_counts_are_not(
    private_db: tuple[str, redis.Redis],
) -> None:
    url, r = private_db
    active = {f"http|busy-{i:02d}|root": NOW_MS + 1000 * i for i in range(55)}
    waiting = [f"http|wait-{i:02d}|root" for i in range(10)]
    r.zadd(keys.active_index(), active)
    r.zadd(keys.queued_index(), {conv: NOW_MS - i for i, conv in enumerate(waiting)})
    for conv in waiting:
        fill(r, conv, 2)

    status = status_of(url)
    assert (status.active_conversations, status.pending_conversations) == (55, 10)
    assert (status.active_requests, status.pending_requests) == (55, 20)
    assert [c.conversation for c in status.conversations] == sorted(active)[:50]
