"""A worker process's heartbeat and what silence means: the reaper's liveness input.

:class:`Heartbeat` writes one Lua call (in Redis server time) every ``interval_s``;
:class:`Liveness` says how often a worker beats and how long a silence means it is dead.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis

from fermix_shared import keys, lua
from fermix_shared.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["Heartbeat", "Liveness"]


@dataclass(frozen=True)
class Liveness:
    """How often a worker beats, and how long a silence means it is dead."""

    heartbeat_s: float
    dead_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Liveness:
        beat = settings.worker_heartbeat_seconds
        return cls(beat, max(settings.worker_dead_seconds, 3 * beat))

    @property
    def dead_ms(self) -> int:
        return int(self.dead_s * 1000)


class Heartbeat:
    """Writes this process's heartbeat every ``interval_s`` in a background thread (a greenlet
    under gevent), and knows how long its own writes have succeeded without a gap."""

    def __init__(self, r: redis.Redis, worker: str, node: str, interval_s: float):
        self._r, self.worker, self._node = r, worker, node
        self._interval = interval_s
        self._stop = threading.Event()
        self._beating = threading.Lock()  # a beat in flight never lands after mark_stopped
        self._healthy_since: float | None = None
        self._last_ok = 0.0

    def beat(self) -> None:
        lua.BEAT(self._r, beats=keys.worker_beats(), workers=keys.workers(), worker=self.worker,
                 node=self._node, seen=f"{time.time():.3f}")
        t = time.monotonic()
        # A beat that came late (a Redis blip, a stalled process) starts the count again.
        if self._healthy_since is None or t - self._last_ok > 2 * self._interval:
            self._healthy_since = t
        self._last_ok = t

    def healthy_for(self) -> float:
        """Seconds this process has beaten on time, without a gap (0 while it has not)."""
        t = time.monotonic()
        if self._healthy_since is None or t - self._last_ok > 2 * self._interval:
            return 0.0
        return t - self._healthy_since

    def start(self) -> None:
        threading.Thread(target=self._run, name="fermix-heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def mark_stopped(self) -> None:
        """A beat of 0: the process has stopped, whatever it still held is recovered at once.
        Stops the beats too (none lands after this)."""
        self._stop.set()
        with self._beating:
            self._r.hset(keys.worker_beats(), self.worker, 0)
            self._r.hdel(keys.workers(), self._node)

    def _run(self) -> None:
        while True:
            with self._beating:
                if self._stop.is_set():
                    return
                try:
                    self.beat()
                except Exception:
                    log.warning("worker heartbeat failed", exc_info=True)
            if self._stop.wait(self._interval):
                return
