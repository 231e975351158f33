"""A Redis-backed send rate limiter shared by every worker, and platform-imposed pauses.

Each limit is a key holding the time its next send may happen. ``acquire`` reserves a slot
under all of a send's limits at once (per chat and global) and returns how long to wait;
``block`` records a 429's ``retry_after`` so every worker holds off, not just the one that got it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from fermix_shared import keys, lua


class RateLimiter:
    def __init__(self, r: redis.Redis, sleep: Callable[[float], None] = time.sleep):
        self._r = r
        self._sleep = sleep

    def acquire(self, limits: list[tuple[str, float]]) -> float:
        """Wait for a slot under every ``(name, min_interval_s)`` limit; returns the wait."""
        names = [keys.rate_limit(name) for name, _ in limits]
        intervals = [int(interval * 1000) for _, interval in limits]
        wait_ms = int(lua.RATE_LIMIT(self._r, limits=names, now_ms=int(time.time() * 1000),
                                     intervals_ms=intervals))
        if wait_ms > 0:
            self._sleep(wait_ms / 1000)
        return wait_ms / 1000

    def block(self, name: str, seconds: float) -> None:
        """The platform said wait ``seconds`` (429): nobody sends under ``name`` until then."""
        until = int((time.time() + seconds) * 1000)
        key = keys.rate_limit(name)
        current = self._r.get(key)
        if current is None or int(current) < until:
            self._r.set(key, until, px=int(seconds * 1000) + 1000)
