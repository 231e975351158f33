"""A channel-agnostic typing indicator for the duration of a turn.

While a turn is running, the channel is sent a typing indicator every ``interval`` seconds (4 by
default: platforms show one for about 5 s). It stops when the turn ends, and after
``max_duration`` (5 minutes) regardless, so a stuck turn does not look busy forever. Plain
threading: under the gevent pool the thread is a greenlet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)

# How long leaving the context waits for a send stuck in the network before giving up on it;
# the thread is a daemon and ends after that send anyway.
JOIN_TIMEOUT_SECONDS = 5.0
# The seed's cadence: an indicator every 4 seconds, stopped after 5 minutes regardless.
TYPING_INTERVAL_SECONDS = 4.0
TYPING_MAX_SECONDS = 300.0


class TypingIndicator:
    """Calls ``send()`` at once, then every ``interval`` s, until the context exits or
    ``max_duration`` s have passed since it was entered.

    ``clock`` and ``wait`` exist for tests: ``wait(seconds)`` must return True when the
    indicator should stop; by default it waits on the indicator's own stop signal, so leaving
    the context interrupts it at once. A ``send`` that raises is logged (its type only: the
    message may carry a bot token or URL) and the cadence continues.

    ``send_at_once=False`` skips the first send (for a caller that showed the indicator itself
    before entering, to learn whether it works); ``on_expire`` is called once when
    ``max_duration`` passes with the context still open (Slack clears its thread status then:
    unlike Telegram's typing, it does not fade by itself).
    """

    def __init__(
        self,
        send: Callable[[], None],
        *,
        interval: float = TYPING_INTERVAL_SECONDS,
        max_duration: float = TYPING_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        send_at_once: bool = True,
        on_expire: Callable[[], None] | None = None,
    ) -> None:
        if interval <= 0 or max_duration < 0:
            raise ValueError("interval must be positive and max_duration not negative")
        self._send = send
        self._send_at_once = send_at_once
        self._on_expire = on_expire
        self._interval = interval
        self._max_duration = max_duration
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._thread: threading.Thread | None = None
        self._failures = 0

    def __enter__(self) -> TypingIndicator:
        if self._thread is not None:
            raise RuntimeError("a TypingIndicator runs once; create a new one per turn")
        self._thread = threading.Thread(
            target=self._run, args=(self._clock(),), name="typing-indicator", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_SECONDS)

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until the indicator has stopped (by itself or on exit); True if it has."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self, started: float) -> None:
        deadline = started + self._max_duration
        next_at = started
        send_now = self._send_at_once
        while not self._stop.is_set() and self._clock() < deadline:
            if send_now:
                self._send_once(self._send)
            send_now = True
            # Ticks are counted from the start; a send slower than the interval delays the next
            # one instead of causing a burst.
            next_at = max(next_at + self._interval, self._clock())
            if self._wait(max(0.0, min(next_at, deadline) - self._clock())):
                return
        if self._on_expire is not None and not self._stop.is_set():
            self._send_once(self._on_expire)

    def _send_once(self, send: Callable[[], None]) -> None:
        try:
            send()
        except Exception as e:
            self._failures += 1
            # The first failure is worth a warning; a channel that is down would otherwise log
            # one every interval for the whole turn.
            level = logging.WARNING if self._failures == 1 else logging.DEBUG
            log.log(level, "typing indicator send failed (%s), will retry", type(e).__name__)
