"""Graceful worker shutdown: finish what fits in a grace period, hand the rest over at once.

On SIGTERM (Celery's ``worker_shutting_down``) Celery stops consuming and its pool waits for
the tasks in flight; :class:`GracefulStop` gives those turns ``FERMIX_WORKER_SHUTDOWN_GRACE``
seconds. At the grace it interrupts the turns still running (:func:`hand_off_all`): each stops
where it is, keeps its last checkpoint and leaves its lease, so the pool's wait ends within a
second. As soon as they have left, the worker marks itself stopped (a heartbeat of 0) and
:func:`release_held` ends the leases it still holds and dispatches each of those
conversations (again at ``worker_shutdown``, for anything left), so another worker resumes the turn at once rather than after the dead-worker
threshold or the lease. The resumed turn delivers its reply once: a handed-over turn delivered
nothing, and delivery is compare-and-deliver (``finish.lua``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from fermix_worker.fleet.reaper import expire_dead_turns
from fermix_worker.interrupt import gevent_active
from fermix_worker.turn.lease import hand_off_all, wait_no_turns

log = logging.getLogger(__name__)


class GracefulStop:
    """The grace timer: :meth:`begin` on SIGTERM, :meth:`end` once the pool has stopped.

    At the grace, ``hand_off`` interrupts the turns still running; once they have left (at most
    ``settle_s``), ``release`` says the worker stopped and ends its leases (see the module)."""

    def __init__(self, grace_s: float, release: Callable[[], None],
                 hand_off: Callable[[], int] = hand_off_all, settle_s: float = 5.0):
        self._grace, self._release, self._hand_off = grace_s, release, hand_off
        self._settle = settle_s
        self._done = threading.Event()
        self._started = False
        self.handed_off = 0

    def begin(self) -> None:
        """Start the grace (once). Returns at once: it runs inside a signal handler, which under
        gevent is a hub callback that must not block (``Thread.start`` would)."""
        if self._started:
            return
        self._started = True
        log.warning("shutting down: turns in flight have %g s to finish", self._grace)
        if gevent_active():
            import gevent

            gevent.spawn(self._run)
        else:
            threading.Thread(target=self._run, name="fermix-shutdown-grace", daemon=True).start()

    def end(self) -> None:
        """The pool has stopped: no hand-over is needed any more."""
        self._done.set()

    def _run(self) -> None:
        if self._done.wait(self._grace):
            return
        self.handed_off = self._hand_off()
        if not self.handed_off:
            return
        log.warning("grace of %g s over: handing %d turn(s) to other workers",
                    self._grace, self.handed_off)
        if not wait_no_turns(self._settle):
            log.warning("turns still running %g s after the hand-over", self._settle)
        try:
            self._release()
        except Exception:  # the worker's shutdown releases them again; the reaper, at worst
            log.warning("could not release the handed-over turns", exc_info=True)


def release_held(r: redis.Redis, worker: str, kick: Callable[[str], None]) -> list[str]:
    """End the leases ``worker`` (stopped: its heartbeat is 0) still holds and dispatch those
    conversations, so another worker resumes each turn from its checkpoint now."""
    expired, _ = expire_dead_turns(r, [worker], dead_ms=1)
    for conv in expired:
        try:
            kick(conv)
        except Exception:  # the reaper recovers a lapsed lease within a scan anyway
            log.warning("could not dispatch handed-over %s", conv, exc_info=True)
    if expired:
        log.warning("handed over %d turn(s): %s", len(expired), expired[:10])
    return expired
