"""The memory review's queue in Redis: which delivered turns wait for their conversation's
review, and when that review is due.

After an operator's delivered interactive turn, :func:`queue_review` records it as pending for
its conversation (one list push and one sorted-set update) and makes the conversation's review
due once it has been quiet for ``memory_review_quiet_seconds`` (each new turn pushes that
back), or at once when ``memory_review_batch_turns`` turns wait. The fleet's sweeper starts
due reviews (:func:`start_due_reviews`, the ZREM decides who). Nothing is missed: pending turns
stay in Redis until a review took them, through restarts. The review itself is the worker's
(:mod:`fermix_worker.memory.reviewer`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis

from fermix_shared import keys

# How long one conversation's review may run before another may start (its lock's TTL).
REVIEWING_TTL_S = 300
# Due reviews started per sweep.
DUE_LIMIT = 100


def queue_review(r: redis.Redis, run_id: str, conv: str, agent: str, user: str,
                 quiet_s: float, batch: int, now_ms: int | None = None) -> None:
    """Record ``run_id`` as waiting for its conversation's next review, and set when that is
    due: ``quiet_s`` from now (a later turn pushes it back), or now once ``batch`` wait."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    entry = json.dumps({"run_id": run_id, "agent": agent, "user": user})
    # One round trip: the entry, and the review due once the conversation is quiet; brought
    # forward to now (a second round trip) only when the entry completes a batch.
    pipe = r.pipeline(transaction=False)
    pipe.rpush(keys.memory_pending(conv), entry)
    pipe.expire(keys.memory_pending(conv), keys.MEMORY_REVIEWED_TTL_SECONDS)
    pipe.zadd(keys.memory_review_due(), {conv: now + int(quiet_s * 1000)})
    waiting = pipe.execute()[0]
    if int(waiting) >= batch:
        r.zadd(keys.memory_review_due(), {conv: now})


def start_due_reviews(r: redis.Redis, send: Callable[[str], None],
                      now_ms: int | None = None) -> list[str]:
    """The sweeper's part: start the review of every conversation whose review is due (the
    ZREM that removes it decides which process sends it). Returns those conversations."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    due: Any = r.zrangebyscore(keys.memory_review_due(), "-inf", now, start=0, num=DUE_LIMIT)
    started = []
    for raw in due:
        conv = raw.decode() if isinstance(raw, bytes) else str(raw)
        if r.zrem(keys.memory_review_due(), conv):
            send(conv)
            started.append(conv)
    return started


def pending(r: redis.Redis, conv: str) -> list[dict[str, str]]:
    """The conversation's pending turns, oldest first (left in place until reviewed)."""
    out = []
    for raw in r.lrange(keys.memory_pending(conv), 0, -1):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("run_id"), str):
            out.append({k: str(entry.get(k) or "") for k in ("run_id", "agent", "user")})
    return out


def lock(r: redis.Redis, conv: str) -> bool:
    """Take the conversation's review lock; False if another review of it runs. When it does,
    the conversation is made due again 5 s from now (that review should be done by then)."""
    if r.set(keys.memory_reviewing(conv), "1", nx=True, ex=REVIEWING_TTL_S):
        return True
    r.zadd(keys.memory_review_due(), {conv: int(time.time() * 1000) + 5_000})
    return False


def reviewed(r: redis.Redis, conv: str, taken: int) -> None:
    """Drop the ``taken`` oldest pending turns: what came in meanwhile stays for the next
    review."""
    if taken:
        r.ltrim(keys.memory_pending(conv), taken, -1)


def unlock(r: redis.Redis, conv: str) -> None:
    """Release the conversation's review lock (after a review, whatever its outcome)."""
    r.delete(keys.memory_reviewing(conv))


def first_review(r: redis.Redis, run_id: str) -> bool:
    """True once per run: a run is reviewed once, alone or in a batch, whatever redelivers."""
    return bool(r.set(keys.memory_reviewed(run_id), "1", nx=True,
                      ex=keys.MEMORY_REVIEWED_TTL_SECONDS))
