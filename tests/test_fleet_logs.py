"""What a failed fleet test shows of its processes' logs (tests/fleet_logs.py)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.fleet_logs import problems


def test_a_failure_shows_the_last_warnings_and_errors_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "x-gateway.log"
    lines = [f"[2026-12-04 01:55:{i:02},946: {level}/MainProcess] fermix_gateway.app: line {i}"
             for i, level in enumerate(["INFO", "WARNING", "ERROR", "DEBUG"] * 10)]
    log.write_text("\n".join([*lines, "Traceback (most recent call last):"]) + "\n")
    shown = problems(log, lines=3)
    assert [s.rsplit(" ", 1)[1] for s in shown] == ["34", "37", "38"]
    assert all(": WARNING/" in s or ": ERROR/" in s for s in shown)
    # Only what was logged since the test began (here: from 01:55:30 on).
    since = datetime(2026, 12, 4, 1, 55, 30).timestamp() + 1.0
    assert [s.rsplit(" ", 1)[1] for s in problems(log, since)] == [
        "30", "33", "34", "37", "38"]
