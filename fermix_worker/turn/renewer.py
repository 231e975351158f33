"""One renewer per process for every running turn's lease, and one watch for their deadlines.

A worker process holding N turns used to renew N leases with N threads (greenlets), each one
EVALSHA every interval: 2 N round trips and 2 N wake-ups a second at the default 0.5 s. Here
one background thread (a greenlet under gevent), started on first use, renews all of them at
once: every interval one pipeline per Redis client (:func:`~fermix_shared.stores.lease.
renew_leases`), and each answer goes back to its turn's :class:`Renewed` holder. Turns are
grouped by interval (one per process in production, FERMIX_CANCEL_POLL_SECONDS); a turn that
joins is first renewed at its group's next tick, within one interval. A batch that fails
(Redis unreachable) is logged and sent again next interval: the lease has slack. A turn that
leaves is never renewed afterwards: :meth:`LeaseRenewer.remove` waits for a batch in flight
that carries it.

Deadlines are a second thread, :class:`DeadlineWatch`, so that a batch waiting on Redis
never delays a turn's timeout: it sleeps until the earliest registered deadline and calls
its callback then, once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fermix_shared.stores.lease import Renewal, TurnLease, renew_leases

log = logging.getLogger(__name__)

# How long a leaving turn waits for a batch in flight that carries it (seconds).
SETTLE_S = 5.0


class Renewed(Protocol):
    """A running turn as the renewer sees it: its lease, and what to do with each answer."""

    @property
    def lease(self) -> TurnLease: ...

    def renewed(self, renewal: Renewal) -> None:
        """Called from the renewer's thread after each renewal of :attr:`lease`."""


@dataclass(eq=False)
class _Group:
    """The turns renewed every ``interval`` seconds, and when next."""

    interval: float
    next_at: float  # time.monotonic()
    members: dict[Renewed, None] = field(default_factory=dict)  # ordered set
    sending: set[Renewed] = field(default_factory=set)


class LeaseRenewer:
    """Renews every registered lease, one pipeline per Redis client per interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._settled = threading.Condition(self._lock)
        self._groups: dict[float, _Group] = {}
        self._thread: threading.Thread | None = None

    def add(self, holder: Renewed, interval_s: float) -> None:
        """Renew ``holder``'s lease every ``interval_s`` from the group's next tick on."""
        with self._lock:
            group = self._groups.get(interval_s)
            if group is None:
                group = _Group(interval_s, time.monotonic() + interval_s)
                self._groups[interval_s] = group
                self._wake.notify()
            group.members[holder] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lease-renewer",
                                                daemon=True)
                self._thread.start()

    def remove(self, holder: Renewed, interval_s: float) -> None:
        """Renew ``holder`` no more; returns once no batch in flight carries it."""
        with self._lock:
            group = self._groups.get(interval_s)
            if group is None:
                return
            group.members.pop(holder, None)
            until = time.monotonic() + SETTLE_S
            while holder in group.sending and (left := until - time.monotonic()) > 0:
                self._settled.wait(left)

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._next_batch()
            try:
                self._renew(due)
            except Exception:  # keep renewing the others whatever one holder did
                log.exception("lease renewer: a batch failed")
            finally:
                with self._lock:
                    for group in self._groups.values():
                        group.sending.clear()
                    self._settled.notify_all()

    def _next_batch(self) -> list[Renewed]:
        """Wait (holding the lock between waits) until a group is due; its members, marked
        as in flight."""
        while True:
            for interval in [i for i, g in self._groups.items() if not g.members]:
                del self._groups[interval]
            if not self._groups:
                self._wake.wait()
                continue
            now = time.monotonic()
            first = min(g.next_at for g in self._groups.values())
            if first > now:
                self._wake.wait(first - now)
                continue
            due: list[Renewed] = []
            for group in self._groups.values():
                if group.next_at <= now:
                    group.next_at += group.interval
                    if group.next_at <= now:  # a batch outlasted the interval: no burst
                        group.next_at = now + group.interval
                    due.extend(group.members)
                    group.sending.update(group.members)
            return due

    def _renew(self, due: list[Renewed]) -> None:
        answers = renew_leases([h.lease for h in due])
        failed: dict[int, tuple[Exception, list[Renewed]]] = {}  # a pipeline's error: its turns
        for holder, answer in zip(due, answers, strict=True):
            if isinstance(answer, Exception):
                failed.setdefault(id(answer), (answer, []))[1].append(holder)
                continue
            if not answer[0]:  # fenced: nothing more to renew
                with self._lock:
                    for group in self._groups.values():
                        group.members.pop(holder, None)
            holder.renewed(answer)
        for error, holders in failed.values():  # a Redis blip: next interval; the lease has slack
            log.warning("lease renewal for %s failed", _turns(holders), exc_info=error)


def _turns(holders: list[Renewed]) -> str:
    if len(holders) == 1:
        return holders[0].lease.turn_id
    return f"{len(holders)} turns"


@dataclass(eq=False)
class Deadline:
    """One registered deadline; :meth:`DeadlineWatch.cancel` it when the turn ends."""

    at: float  # time.time()
    fire: Callable[[], None]
    cancelled: bool = False


class DeadlineWatch:
    """Calls each registered callback once, as soon as its wall-clock time has passed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._cancelled = 0
        self._thread: threading.Thread | None = None

    def add(self, at: float, fire: Callable[[], None]) -> Deadline:
        """Call ``fire()`` (from the watch's thread) once ``time.time() >= at``."""
        entry = Deadline(at, fire)
        with self._lock:
            heapq.heappush(self._heap, (at, next(self._order), entry))
            if self._heap[0][2] is entry:
                self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="turn-deadlines",
                                                daemon=True)
                self._thread.start()
        return entry

    def cancel(self, entry: Deadline) -> None:
        """Never fire ``entry`` (a no-op once it fired)."""
        with self._lock:
            if entry.cancelled:
                return
            entry.cancelled = True
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [item for item in self._heap if not item[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._next_due()
            for entry in due:
                try:
                    entry.fire()
                except Exception:
                    log.exception("turn deadline callback failed")

    def _next_due(self) -> list[Deadline]:
        while True:
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
                self._cancelled -= 1
            if not self._heap:
                self._wake.wait()
                continue
            left = self._heap[0][0] - time.time()
            if left > 0:
                self._wake.wait(left)
                continue
            due = []
            while self._heap and self._heap[0][0] <= time.time():
                entry = heapq.heappop(self._heap)[2]
                if entry.cancelled:
                    self._cancelled -= 1
                else:
                    entry.cancelled = True  # fired: cancelling it later is a no-op
                    due.append(entry)
            return due


_renewer: LeaseRenewer | None = None
_deadlines: DeadlineWatch | None = None
_shared_lock = threading.Lock()


def renewer() -> LeaseRenewer:
    """This process's renewer (created on first use)."""
    global _renewer
    with _shared_lock:
        if _renewer is None:
            _renewer = LeaseRenewer()
        return _renewer


def deadlines() -> DeadlineWatch:
    """This process's deadline watch (created on first use)."""
    global _deadlines
    with _shared_lock:
        if _deadlines is None:
            _deadlines = DeadlineWatch()
        return _deadlines


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads: it starts its own on first use.
    global _renewer, _deadlines, _shared_lock
    _renewer, _deadlines, _shared_lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
