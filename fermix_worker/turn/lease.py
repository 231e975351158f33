"""LeaseKeeper: renews a turn's lease in the background, watches for /stop and the deadline.

Every ``interval`` the lease is renewed (one Lua call that also reports a /stop), by the
process's one renewer (:mod:`fermix_worker.turn.renewer`: every turn of the process in one
pipeline), and the deadline is watched by the process's one deadline watch. If the
conversation was taken by someone else (our lease lapsed and a recovery claimed it), the turn
is fenced: :meth:`check` raises :class:`LeaseLost`, and the commit would be refused anyway.
If the turn was cancelled, :meth:`check` raises :class:`TurnCancelled`; once the turn's
wall-clock deadline has passed, :class:`TurnTimedOut`. The loop calls ``check`` between steps
and on every streamed delta; work that blocks in between (a silent model call, a long tool)
runs inside :meth:`interruptible`, where the keeper interrupts it as soon as it sees one of
the three (under gevent: within one interval, the connection closed and the slot freed).

A worker that is shutting down hands its turns over (:func:`hand_off_all`, at the end of its
grace): each running turn then stops as if fenced (:class:`HandedOff`, a :class:`LeaseLost`)
at once, keeping its last checkpoint and its lease, which the worker then ends so that another
worker resumes the turn at once (see :mod:`fermix_worker.fleet.shutdown`).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fermix_shared.agents.definitions import turn_agent
from fermix_shared.errors import JobTimedOut, LeaseLost, TurnCancelled, TurnTimedOut
from fermix_shared.models import InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores.lease import Renewal, TurnLease
from fermix_worker.interrupt import Interrupter
from fermix_worker.turn.renewer import Deadline, deadlines, renewer


class HandedOff(LeaseLost):
    """The worker is shutting down: the turn stops where it is and resumes on another worker
    from its last checkpoint (it delivers and commits nothing here)."""


_live: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()
_live_lock = threading.Lock()
_none_live = threading.Condition(_live_lock)
_handing_off = threading.Event()


def hand_off_all() -> int:
    """Interrupt every turn this process is running (and any it starts from now on) with
    :class:`HandedOff`; returns how many were running."""
    _handing_off.set()
    with _live_lock:
        keepers = list(_live)
    for keeper in keepers:
        keeper.hand_off()
    return len(keepers)


def wait_no_turns(timeout_s: float) -> bool:
    """Wait until this process runs no turn (after :func:`hand_off_all`); False on timeout."""
    with _none_live:
        return _none_live.wait_for(lambda: not _live, timeout_s)


class TurnDeadline:
    """When a turn must end: ``at`` (Unix time) and what to raise then; ``at=None``: never."""

    def __init__(self, at: float | None, timed_out: Callable[[], TurnTimedOut]):
        self.at = at
        self._timed_out = timed_out

    @classmethod
    def none(cls) -> TurnDeadline:
        return cls(None, lambda: TurnTimedOut(0))

    def passed(self) -> bool:
        return self.at is not None and time.time() >= self.at

    def error(self) -> TurnTimedOut:
        return self._timed_out()


def turn_deadline(msg: InboundMessage, started_at: float, settings: Settings) -> TurnDeadline:
    """A scheduled job's own timeout (capped by FERMIX_TURN_TIMEOUT as it is now), else the
    agent's ``timeout_seconds``, else FERMIX_TURN_TIMEOUT (0: none), from the turn's start (its
    first start: a resumed turn keeps its deadline)."""
    if msg.timeout_s is not None:
        # Checked against FERMIX_TURN_TIMEOUT when the job was made; one lowered since wins.
        job_timeout = msg.timeout_s
        if 0 < settings.turn_timeout < job_timeout:
            job_timeout = settings.turn_timeout
        return TurnDeadline(started_at + job_timeout, lambda: JobTimedOut(job_timeout))
    agent_timeout = turn_agent(settings.agents, msg.agent).timeout_seconds
    timeout = settings.turn_timeout if agent_timeout is None else agent_timeout
    if timeout > 0:
        return TurnDeadline(started_at + timeout, lambda: TurnTimedOut(timeout))
    return TurnDeadline.none()


class LeaseKeeper:
    """A running turn's hold on its conversation: see the module docstring. Use it as a
    context manager around the turn; ``interval_s`` is how often the lease is renewed."""

    def __init__(self, lease: TurnLease, interval_s: float, deadline: TurnDeadline | None = None):
        self._lease = lease
        self._interval = interval_s
        self._deadline = deadline or TurnDeadline.none()
        self._lost = threading.Event()
        self.cancelled = ""
        self._interrupter = Interrupter()
        self._timer: Deadline | None = None
        self._handed_off = False

    @property
    def lease(self) -> TurnLease:
        """The hold this keeper renews."""
        return self._lease

    def __enter__(self) -> LeaseKeeper:
        with _live_lock:
            _live.add(self)
        renewer().add(self, self._interval)
        if self._deadline.at is not None:
            self._timer = deadlines().add(self._deadline.at, self._timed_out)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            deadlines().cancel(self._timer)
        renewer().remove(self, self._interval)
        with _none_live:
            _live.discard(self)
            _none_live.notify_all()

    def hand_off(self) -> None:
        """The worker is shutting down: stop the turn (its next :meth:`check` raises
        :class:`HandedOff`), interrupting blocking work at once."""
        self._handed_off = True
        self._interrupter.interrupt()

    def renewed(self, renewal: Renewal) -> None:
        """The process's renewer renewed the lease (its thread): act on a loss or a /stop."""
        held, cancelled = renewal
        if not held:
            self._lost.set()
            self._interrupter.interrupt()
        elif cancelled:
            self.cancelled = cancelled
            self._interrupter.interrupt()

    def _timed_out(self) -> None:
        # Once, from the deadline watch; the lease is still renewed while the turn closes.
        if not self._lost.is_set():
            self._interrupter.interrupt()

    def check(self) -> None:
        """Raise if the turn must stop: LeaseLost (fenced), TurnCancelled (/stop) or
        TurnTimedOut (its deadline passed)."""
        if self._lost.is_set():
            raise LeaseLost(self._lease.turn_id)
        if self._handed_off or _handing_off.is_set():
            raise HandedOff(self._lease.turn_id)
        if self.cancelled:
            raise TurnCancelled(self.cancelled)
        if self._deadline.passed():
            raise self._deadline.error()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Blocking work the keeper may cut short: it then raises what :meth:`check` raises."""
        self.check()
        with self._interrupter.armed(self.check):
            yield
