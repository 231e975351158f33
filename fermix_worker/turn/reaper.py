"""The reaper: finds turns whose worker died and conversations nobody is dispatching.

It runs on a timer in every worker (so recovery needs no special process); a short Redis lock
lets one worker per interval do the scan. It only *kicks* dispatches: the atomic claim decides
what happens (an expired lease is closed as an orphan; a free conversation runs its next
message), so a kick too many is harmless.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from fermix_shared import keys, metrics
from fermix_shared.stores.queue import now_ms

log = logging.getLogger(__name__)


def reap(r: redis.Redis, kick: Callable[[str], None], interval_s: float, stale_s: float) -> list[str]:
    """One scan; returns the conversations it kicked (empty if another worker holds the lock)."""
    if not r.set(keys.reaper_lock(), "1", nx=True, px=int(interval_s * 1000 * 0.9)):
        return []
    now = now_ms()
    expired: Any = r.zrangebyscore(keys.active_index(), "-inf", now, start=0, num=500)
    stale: Any = r.zrangebyscore(keys.queued_index(), "-inf", now - int(stale_s * 1000), start=0, num=500)
    if stale:
        pipe = r.pipeline(transaction=False)
        for conv in stale:
            pipe.zscore(keys.active_index(), conv)
        # A conversation with a live turn gets its next dispatch when that turn finishes.
        stale = [c for c, score in zip(stale, pipe.execute(), strict=True) if score is None]
    if stale:
        metrics.count_reaper_recovery("stale_kicked", len(stale))
    kicked = list(dict.fromkeys([*expired, *stale]))
    for conv in kicked:
        kick(conv)
    if kicked:
        log.info("reaper kicked %d conversation(s): %s", len(kicked), kicked[:10])
    return kicked


class Reaper:
    """Runs :func:`reap` every ``interval_s`` in a background thread (a greenlet under gevent)."""

    def __init__(self, r: redis.Redis, kick: Callable[[str], None], interval_s: float, stale_s: float):
        self._r, self._kick = r, kick
        self._interval, self._stale = interval_s, stale_s
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="fermix-reaper", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                reap(self._r, self._kick, self._interval, self._stale)
            except Exception:
                log.warning("reaper scan failed", exc_info=True)
