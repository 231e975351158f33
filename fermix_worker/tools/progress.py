"""Tool progress: a long tool reports how it is doing while it runs (the seed's ``tool`` event
phases start / update / result).

A tool calls :meth:`~fermix_worker.tools.context.RunContext.report` on the context it was
given with a short line (a command's latest output, "3 of 10 files"); the loop gives each tool
call a context whose reporter is :func:`throttled` around the run's ``tool`` update event.
Without a reporter (a unit test, a subagent nobody watches) a report does nothing. Reports are
rate-limited per call so a chatty tool cannot flood the run's event stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# At most one update per this many seconds per call; reports in between are dropped (the
# result follows anyway).
MIN_INTERVAL_S = 0.25
MAX_UPDATE_CHARS = 2000


def throttled(emit: Callable[[str], None]) -> Callable[[str], None]:
    """``emit``, called at most once per :data:`MIN_INTERVAL_S` (one per tool call)."""
    last = [0.0]

    def throttle(text: str) -> None:
        now = time.monotonic()
        if now - last[0] >= MIN_INTERVAL_S:
            last[0] = now
            emit(text)

    return throttle
