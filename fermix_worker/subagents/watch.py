"""SubagentWatch: stops a running subagent when its parent is stopped or its time is up.

A background thread (a greenlet under gevent) polls the parent turn's active hash every
``poll_s``: a ``cancelled`` field (/stop, or its agent killed) or a turn id that is no longer the parent's (the turn
was closed) cancels the subagent, and so does a lost claim (``held``: its worker was taken for
dead and a re-run took the subagent over); the same tick renews the subagent's concurrency
slot. The loop calls :meth:`check` between steps and on every streamed delta (cooperative). A
model call that is silent for long (time to first token) would not see that until its first
byte, so the loop runs inside the watch's :class:`~fermix_worker.interrupt.Interrupter`
region: under gevent the watch interrupts it at once; under other pools the SDK's read timeout
(set to the subagent's remaining time) bounds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import redis

from fermix_shared import keys
from fermix_shared.agents.lifecycle import KILL_REASON
from fermix_shared.errors import ControlSignal, TurnCancelled
from fermix_worker.interrupt import Interrupter
from fermix_worker.subagents.semaphore import FanOutSemaphore

log = logging.getLogger(__name__)


# Why a subagent stops when its worker was taken for dead and a re-run took it over.
SUPERSEDED = "the subagent was re-run on another worker"
# Why a subagent stops when its parent's agent was killed (the kill cascades to it).
KILLED_PARENT = "the parent's agent was killed"


class SubagentTimedOut(ControlSignal):
    """The subagent's wall-clock budget (the per-worker timeout) ran out."""


def parent_stopped(r: redis.Redis, conv: str, run_id: str) -> str:
    """Why the parent turn no longer wants results ("" while it waits for them)."""
    turn_id, cancelled = r.hmget(keys.active(conv), ["turn_id", "cancelled"])
    if cancelled in (KILL_REASON, KILL_REASON.encode()):
        return KILLED_PARENT
    if cancelled:
        return "the parent turn was stopped"
    if turn_id != run_id:
        return "the parent turn already ended"
    return ""


class SubagentWatch:
    """Context manager around one subagent's loop; see the module docstring."""

    def __init__(
        self, r: redis.Redis, conv: str, parent_run: str, deadline: float, *,
        slots: FanOutSemaphore, holder: str, poll_s: float,
        held: Callable[[], bool] | None = None,
    ):
        self._r, self._conv, self._parent = r, conv, parent_run
        self._held = held
        self._deadline = deadline  # time.monotonic() value
        self._slots, self._holder = slots, holder
        self._poll = max(0.05, poll_s)
        self._stop = threading.Event()
        self._interrupter: Interrupter | None = None
        self._region: AbstractContextManager[None] | None = None
        self._thread: threading.Thread | None = None
        self.cancelled = ""

    def __enter__(self) -> SubagentWatch:
        self._interrupter = Interrupter()  # in the subagent's own greenlet
        self._region = self._interrupter.armed(self.check)
        self._region.__enter__()
        self._thread = threading.Thread(target=self._run, name="subagent-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            # First: no interrupt may land after the loop is done. An interrupt that did land
            # is raised from here as the ControlSignal that caused it.
            if self._region is not None:
                self._region.__exit__(*exc)  # type: ignore[arg-type]
        finally:
            self._stop.set()
            if self._thread is not None:  # before the slot is released: no renewal after it
                self._thread.join(timeout=5)

    def check(self) -> None:
        """Raise TurnCancelled (parent stopped) or SubagentTimedOut (deadline passed)."""
        if self.cancelled:
            raise TurnCancelled(self.cancelled)
        if time.monotonic() >= self._deadline:
            raise SubagentTimedOut("the subagent ran out of time")

    def _run(self) -> None:
        while not self._stop.wait(min(self._poll, max(0.0, self._deadline - time.monotonic()))):
            if time.monotonic() >= self._deadline:
                self._interrupt()
                return
            try:
                why = parent_stopped(self._r, self._conv, self._parent)
                if not why and self._held is not None and not self._held():
                    why = SUPERSEDED
                if not why and not self._slots.renew(self._holder):
                    log.warning("subagent %s lost its slot lease", self._holder)
            except Exception:  # a Redis blip: look again next tick
                log.warning("subagent watch for %s failed", self._parent, exc_info=True)
                continue
            if why:
                self.cancelled = why
                self._interrupt()
                return

    def _interrupt(self) -> None:
        if self._interrupter is not None:
            self._interrupter.interrupt()
