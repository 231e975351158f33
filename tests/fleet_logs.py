"""A failed test that ran processes shows what they logged as errors while it ran.

CI prints a failure's traceback, not the gateway's or a worker's log: a 503 from a gateway
says only "storage unavailable". For a test that fails in its setup or body and whose fixtures
include ``logs_dir``, the report gets one section per process log: its last :data:`LINES`
lines at WARNING or above logged since the test's setup began (by the line's own time, in
Fermix's log format). A log that cannot be read is left out; a passing test costs one clock
read. Registered from ``tests/conftest.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Generator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

LINES = 20
# "[2026-12-04 01:55:41,946: ERROR/MainProcess] ..." (fermix_shared/logs.py's format)
_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): (WARNING|ERROR|CRITICAL)/")
_began = pytest.StashKey[float]()


def problems(log: Path, since: float = 0.0, lines: int = LINES) -> list[str]:
    """The last ``lines`` lines of ``log`` logged at WARNING or above at or after ``since``
    (seconds since the epoch; the processes log local time, as this process reads it)."""
    found = []
    with log.open(errors="replace") as f:
        for line in f:
            m = _LINE.match(line)
            if m is None:
                continue
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            if at + int(m.group(2)) / 1000 >= since - 1.0:  # a second's slack: clocks round
                found.append(line.rstrip("\n"))
    return found[-lines:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_began] = time.time()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, Any, Any]:
    report = yield
    logs = getattr(item, "funcargs", {}).get("logs_dir")
    if call.when == "teardown" or not report.failed or not isinstance(logs, Path):
        return report
    began = item.stash.get(_began, 0.0)
    try:
        for log in sorted(logs.rglob("*.log")):
            if log.is_file() and (found := problems(log, began)):
                report.sections.append((f"{log.name}: warnings and errors", "\n".join(found)))
    except OSError:  # a log removed or unreadable: the failure as it is
        pass
    return report
