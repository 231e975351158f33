"""SubagentWatch: stops a running subagent when its parent is stopped or its time is up.

A background thread (a greenlet under gevent) polls the parent turn's active hash every
``poll_s``: a ``cancelled`` field (/stop) or a turn id that is no longer the parent's (the turn
was closed) cancels the subagent; the same tick renews the subagent's concurrency slot. The
loop calls :meth:`check` between steps and on every streamed delta (cooperative). A model call
that is silent for long (time to first token) would not see that until its first byte, so under
gevent the watch also interrupts the armed greenlet at once, the way ``gevent.Timeout`` does;
under other pools the SDK's read timeout (set to the subagent's remaining time) bounds it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from fermix_shared import keys
from fermix_shared.errors import ControlSignal, TurnCancelled
from fermix_worker.subagents.semaphore import FanOutSemaphore

log = logging.getLogger(__name__)


class SubagentTimedOut(ControlSignal):
    """The subagent's wall-clock budget (the per-worker timeout) ran out."""


def parent_stopped(r: redis.Redis, conv: str, run_id: str) -> str:
    """Why the parent turn no longer wants results ("" while it waits for them)."""
    turn_id, cancelled = r.hmget(keys.active(conv), ["turn_id", "cancelled"])
    if cancelled:
        return "the parent turn was stopped"
    if turn_id != run_id:
        return "the parent turn already ended"
    return ""


def _gevent_current() -> Any:
    """The running greenlet when this process runs under gevent, else None."""
    try:
        from gevent import getcurrent, monkey
    except ImportError:
        return None
    return getcurrent() if monkey.is_module_patched("socket") else None


class SubagentWatch:
    """Context manager around one subagent's loop; see the module docstring."""

    def __init__(
        self, r: redis.Redis, conv: str, parent_run: str, deadline: float, *,
        slots: FanOutSemaphore, holder: str, poll_s: float,
    ):
        self._r, self._conv, self._parent = r, conv, parent_run
        self._deadline = deadline  # time.monotonic() value
        self._slots, self._holder = slots, holder
        self._poll = max(0.05, poll_s)
        self._stop = threading.Event()
        self._target: Any = None
        self._armed = False
        self._thread: threading.Thread | None = None
        self.cancelled = ""

    def __enter__(self) -> SubagentWatch:
        self._target = _gevent_current()
        self._armed = True
        self._thread = threading.Thread(target=self._run, name="subagent-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._armed = False  # first: no interrupt may land after the loop is done
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
                self._interrupt(SubagentTimedOut("the subagent ran out of time"))
                return
            try:
                why = parent_stopped(self._r, self._conv, self._parent)
                if not why and not self._slots.renew(self._holder):
                    log.warning("subagent %s lost its slot lease", self._holder)
            except Exception:  # a Redis blip: look again next tick
                log.warning("subagent watch for %s failed", self._parent, exc_info=True)
                continue
            if why:
                self.cancelled = why
                self._interrupt(TurnCancelled(why))
                return

    def _interrupt(self, exc: ControlSignal) -> None:
        if self._target is None:
            return
        from gevent import get_hub

        get_hub().loop.run_callback(self._throw, exc)

    def _throw(self, exc: ControlSignal) -> None:
        # Runs in the hub, while the target is suspended: if it left the loop, do nothing.
        if self._armed and self._target is not None and not self._target.dead:
            self._target.throw(exc)
