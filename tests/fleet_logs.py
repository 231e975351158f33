"""A failed test that ran processes shows what they logged as errors while it ran.

CI prints a failure's traceback, not the gateway's or a worker's log: a 503 from a gateway
says only "storage unavailable". For a failed test whose fixtures include ``logs_dir``, the
report gets one section per process log written during the test: its last
:data:`LINES` lines at WARNING or above. Registered from ``tests/conftest.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

LINES = 20
_LEVEL = re.compile(r"^\[[^\]]*: (WARNING|ERROR|CRITICAL)/")


def problems(log: Path, lines: int = LINES) -> list[str]:
    """The last ``lines`` lines of ``log`` logged at WARNING or above (Fermix's format)."""
    with log.open(errors="replace") as f:
        return [line.rstrip("\n") for line in f if _LEVEL.match(line)][-lines:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    item.stash[_began] = time.time()
    yield


_began = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    logs = getattr(item, "funcargs", {}).get("logs_dir")
    if call.when != "call" or not report.failed or not isinstance(logs, Path):
        return
    began = item.stash.get(_began, 0.0)
    for log in sorted(logs.rglob("*.log")):
        if log.stat().st_mtime >= began and (found := problems(log)):
            report.sections.append((f"{log.name}: warnings and errors", "\n".join(found)))
