"""Interrupting blocking work: a model call that stays silent, or a tool that runs long.

Cooperative checks (between loop steps, on every streamed delta) cannot see a /stop, a lost
lease or a passed deadline while a call blocks on a socket. Under gevent (the worker's default
pool) a watcher can interrupt the blocked greenlet at once, the way ``gevent.Timeout`` does:
it throws :class:`Interrupted`, a ``BaseException`` so that the SDKs' ``except Exception``
retry and wrapping code lets it through and their ``finally`` blocks close the connection.
The greenlet is only interrupted inside an :meth:`Interrupter.armed` region, never while it
delivers or commits. Under other pools :meth:`Interrupter.interrupt` does nothing and the SDK's
read timeout bounds the call.

:func:`call_with_timeout` bounds one call (a tool) by wall-clock time the same way.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from fermix_shared.errors import FermixError

T = TypeVar("T")


# Outside the FermixError tree on purpose: a FermixError is an Exception, and Interrupted must
# pass the ``except Exception`` of the code it interrupts (the SDKs' retry and wrapping code).
# The armed region turns it into the ControlSignal, which is in the tree.
class Interrupted(BaseException):  # noqa: N818 - a control flow signal, like gevent.Timeout
    """Thrown into a blocked greenlet; converted to a ControlSignal by the armed region."""


class CallTimedOut(FermixError):  # noqa: N818
    """:func:`call_with_timeout`'s bound passed; the call was abandoned."""


def gevent_active() -> bool:
    """True when this process runs under gevent (its sockets are patched)."""
    try:
        from gevent import monkey
    except ImportError:
        return False
    return bool(monkey.is_module_patched("socket"))


class Interrupter:
    """Interrupts the greenlet that created it, only while it is inside :meth:`armed`."""

    def __init__(self) -> None:
        self._target: Any = None
        if gevent_active():
            from gevent import getcurrent

            self._target = getcurrent()
        self._armed = False

    @contextmanager
    def armed(self, reason: Callable[[], None]) -> Iterator[None]:
        """Run the body interruptible; an interrupt becomes whatever ``reason()`` raises (the
        ControlSignal that caused it)."""
        self._armed = True
        try:
            yield
        except Interrupted:
            self._armed = False
            reason()
            raise RuntimeError("interrupted without a reason") from None
        finally:
            self._armed = False

    def interrupt(self) -> None:
        """Ask the hub to interrupt the target if it is (still) inside an armed region. Safe to
        call from any greenlet; a no-op outside gevent."""
        if self._target is None:
            return
        from gevent import get_hub

        get_hub().loop.run_callback(self._throw)

    def _throw(self) -> None:
        # Runs in the hub while the target is suspended: if it left the region, do nothing.
        if self._armed and not self._target.dead:
            self._target.throw(Interrupted())


def call_with_timeout(fn: Callable[[], T], seconds: float | None) -> T:
    """``fn()``, abandoned after ``seconds`` with :class:`CallTimedOut`.

    Under gevent the call is interrupted where it blocks (``gevent.Timeout``), so its sockets
    close and nothing keeps running. Elsewhere it runs in a daemon thread that is left behind
    on timeout (Python cannot kill a thread); the caller is free at once either way.
    """
    if seconds is None or seconds <= 0:
        return fn()
    if gevent_active():
        import gevent

        timer = gevent.Timeout(seconds)
        try:
            with timer:
                return fn()
        except gevent.Timeout as t:
            if t is not timer:
                raise
            raise CallTimedOut(seconds) from None
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # the caller's log context (logs.py) goes along

    def target() -> None:
        try:
            box["value"] = context.run(fn)
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    thread = threading.Thread(target=target, name="tool-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CallTimedOut(seconds)
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def interruptible_sleep(seconds: float, check: Callable[[], None], tick: float = 0.2) -> None:
    """A provider retry's wait that still honours /stop, a lost lease and the deadline:
    ``check`` (which raises the reason to stop) runs every ``tick`` seconds."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        check()
        time.sleep(min(tick, left))
    check()
