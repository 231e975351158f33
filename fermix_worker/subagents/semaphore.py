"""A per-fan-out counting semaphore in Redis: the concurrency cap holds fleet-wide.

Holders take a slot with a lease (renewed while their subagent runs) and give it back in a
``finally``; a slot whose holder died (SIGKILL, lost host) frees itself when its lease lapses.
Acquiring never blocks. A header task that gets no slot may wait a bounded while for one
(:meth:`FanOutSemaphore.wait`: every release pushes a wake-up token that one waiter takes, so
a freed slot is taken within milliseconds, not on a retry through the broker); past that it
re-schedules itself instead of holding its worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from fermix_shared import keys, lua

# A running subagent renews its slot far more often than this (every cancel poll).
SLOT_LEASE_S = 30.0
# A waiter looks at its parent (stopped?) at least this often; below the client's socket
# timeout, which a blocking read must never reach.
WAIT_POLL_S = 1.0


class FanOutSemaphore:
    """The slots of one fan-out: at most ``limit`` holders at once."""

    def __init__(self, r: redis.Redis, fanout_id: str, limit: int, ttl_s: float,
                 lease_s: float = SLOT_LEASE_S):
        self._r = r
        self._key = keys.fanout_slots(fanout_id)
        self._wake = keys.fanout_wake(fanout_id)
        self._limit = limit
        self._ttl_ms = int(ttl_s * 1000)
        self._lease_ms = int(lease_s * 1000)

    def _eval(self, op: str, holder: str) -> bool:
        res = lua.FANOUT_SEMAPHORE(self._r, slots=self._key, wake=self._wake, op=op,
                                   holder=holder, limit=self._limit, lease_ms=self._lease_ms,
                                   ttl_ms=self._ttl_ms)
        return int(res) == 1

    def acquire(self, holder: str) -> bool:
        """Take a slot (idempotent for a holder that has one); False when all are taken."""
        return self._eval("acquire", holder)

    def renew(self, holder: str) -> bool:
        """Extend the holder's lease; False if it had lapsed (its slot may be someone else's)."""
        return self._eval("renew", holder)

    def release(self, holder: str) -> None:
        """Give the slot back (and wake one waiter)."""
        self._eval("release", holder)

    def wait(self, holder: str, seconds: float, still_wanted: Callable[[], bool],
             poll_s: float = WAIT_POLL_S) -> bool:
        """Wait up to ``seconds`` for a slot, taking it as soon as one is released; False when
        none came (or ``still_wanted`` said to stop: the parent was stopped). Blocks on Redis
        (BLPOP, in chunks of ``poll_s``): under gevent that is a parked greenlet, nothing more."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.acquire(holder):
                return True
            if not still_wanted():
                return False
            self._r.blpop([self._wake], timeout=max(0.01, min(poll_s, left)))
        return self.acquire(holder)

    def holders(self) -> list[str]:
        """Current holders (expired ones included until the next acquire prunes them)."""
        return [str(h) for h in self._r.zrange(self._key, 0, -1)]
