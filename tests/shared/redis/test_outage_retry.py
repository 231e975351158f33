"""How long a client rides out an unreachable Redis before its command fails: the retry count
whose mean total pause (redis-py's ExponentialWithJitterBackoff) is nearest the budget."""

from __future__ import annotations

import random

from redis.backoff import ExponentialWithJitterBackoff

from fermix_shared.redis.client import (
    _BACKOFF_BASE_S,
    _BACKOFF_CAP_S,
    CLI_OUTAGE_S,
    WORKER_OUTAGE_S,
    _retries_for,
)


def _mean_pause(retries: int, samples: int = 20_000) -> float:
    """The mean of redis-py's own pauses over ``retries`` failures, sampled."""
    backoff = ExponentialWithJitterBackoff(base=_BACKOFF_BASE_S, cap=_BACKOFF_CAP_S)
    random.seed(7)
    return sum(sum(backoff.compute(f) for f in range(1, retries + 1))
               for _ in range(samples)) / samples


def test_a_person_hears_within_about_two_seconds_and_a_worker_rides_out_twenty() -> None:
    assert _retries_for(0) == 0  # `fermix agent --local` does not wait
    cli, worker = _retries_for(CLI_OUTAGE_S), _retries_for(WORKER_OUTAGE_S)
    assert abs(_mean_pause(cli) - CLI_OUTAGE_S) < 0.6  # was 5 retries: 2.9 s on average
    assert abs(_mean_pause(worker) - WORKER_OUTAGE_S) < 1.0
    for budget, n in ((CLI_OUTAGE_S, cli), (WORKER_OUTAGE_S, worker)):
        # One retry more or fewer would be further from the budget.
        assert abs(_mean_pause(n) - budget) <= abs(_mean_pause(n + 1) - budget)
        assert abs(_mean_pause(n) - budget) <= abs(_mean_pause(n - 1) - budget)
