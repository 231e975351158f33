"""Tool progress: a long tool reports how it is doing while it runs (the seed's ``tool`` event
phases start / update / result).

The loop binds a reporter around each tool call; a tool calls :func:`report` with a short line
(a command's latest output, "3 of 10 files"). Without a bound reporter (a unit test, a subagent
nobody watches) the call does nothing. Reports are rate-limited per call so a chatty tool
cannot flood the run's event stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# At most one update per this many seconds per call; reports in between are dropped (the
# result follows anyway).
MIN_INTERVAL_S = 0.25
MAX_UPDATE_CHARS = 2000

_reporter: ContextVar[Callable[[str], None] | None] = ContextVar("fermix_tool_progress",
                                                                 default=None)


def report(text: str) -> None:
    """Tell whoever watches the running tool call how it is doing (cheap; may be dropped when
    reports come faster than :data:`MIN_INTERVAL_S`)."""
    reporter = _reporter.get()
    if reporter is not None and text:
        reporter(text[-MAX_UPDATE_CHARS:])


@contextmanager
def bind_progress(emit: Callable[[str], None]) -> Iterator[None]:
    """Route :func:`report` calls made inside the block to ``emit``, throttled."""
    last = [0.0]

    def throttled(text: str) -> None:
        now = time.monotonic()
        if now - last[0] >= MIN_INTERVAL_S:
            last[0] = now
            emit(text)

    token = _reporter.set(throttled)
    try:
        yield
    finally:
        _reporter.reset(token)
