"""The chaos run, sized down: 600 numbered messages over 60 chats through three workers while
two SIGKILLs hit random workers, Redis is killed and restarted from its AOF and the gateway is
killed and restarted. What the gateway accepted is never lost, never answered twice or out of
order, and no conversation is left stuck. The full run is ``benchmarks/chaos.py`` (10,000
messages over 500 chats; its numbers are in benchmarks/RESULTS.md). Seeded:
FERMIX_CHAOS_SEED=N reproduces a run's fault schedule and model delays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.chaos import ChaosConfig, run

# The stack is started by benchmarks.chaos, which the automatic fleet mark does not read.
pytestmark = pytest.mark.fleet


@pytest.mark.timeout(240)
def test_nothing_accepted_is_lost_doubled_reordered_or_stuck_through_kills_and_restarts(
    logs_dir: Path,
) -> None:
    seed = int(os.environ.get("FERMIX_CHAOS_SEED", "1"))
    cfg = ChaosConfig(messages=600, chats=60, workers=3, kills=2, redis_restarts=1,
                      gateway_restarts=1, rate=30.0, settle_s=90.0, duration_s=200.0,
                      seed=seed, logs=logs_dir / f"chaos-{seed}")
    summary = run(cfg, progress=print)
    report = f"seed={seed}, logs in {cfg.logs}\n{summary.render()}"
    print(report)
    assert not summary.cut_short, report
    assert [f.kind for f in summary.faults].count("kill-worker") == 2, report
    assert summary.accepted == 600, report
    outcome = {"lost": summary.lost, "duplicated": summary.duplicated,
               "order_violations": summary.order_violations, "crossed": summary.crossed,
               "stuck": summary.stuck}
    assert outcome == dict.fromkeys(outcome, 0), report
