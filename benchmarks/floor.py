"""The floor: a trivial Celery task's round trip and throughput on this machine, for the
turn figures' ratios (issue 31: "a turn within 1.5x of a bare Celery round trip").

Two ``celery worker -P gevent -c 64`` processes of ``benchmarks/floor_app.py`` (niced as the
turn workers are) on a Redis database of their own; from this process, ``floor.echo`` sent and
its result awaited one at a time (the round trip: p50 and p99), and ``--burst`` sent at once
and all awaited (tasks/s from the first send to the last result).

    .venv/bin/python benchmarks/floor.py --redis redis://127.0.0.1:6379/15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fermix_dev.procs import Managed, wait_until  # noqa: E402

WORKER_NICE = 10


def start(redis_url: str, tmp: Path, procs: list[Managed], workers: int = 2,
          concurrency: int = 64) -> None:
    """The floor's workers, appended to ``procs``, once both answer a ping."""
    env = {**os.environ, "FLOOR_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    for i in range(workers):
        w = Managed(f"floor-w{i + 1}", ["nice", "-n", str(WORKER_NICE), sys.executable, "-m",
                                        "celery", "-A", "benchmarks.floor_app", "worker",
                                        "-P", "gevent", "-c", str(concurrency), "-n",
                                        f"floor-w{i + 1}@%h", "--without-gossip",
                                        "--without-mingle", "--without-heartbeat",
                                        "-l", "warning"],
                    env=env, log_path=tmp / f"floor-w{i + 1}.log")
        procs.append(w)
    from benchmarks.floor_app import app

    app.conf.broker_url = app.conf.result_backend = redis_url
    wait_until(lambda: len(app.control.ping(timeout=0.5) or []) >= workers, 60,
               "the floor's workers")


def measure(redis_url: str, serial: int = 200, burst: int = 400) -> dict[str, float]:
    """The round trip (ms, p50 and p99 of ``serial``) and tasks/s over ``burst`` at once."""
    from benchmarks.floor_app import app, echo

    app.conf.broker_url = app.conf.result_backend = redis_url
    for i in range(20):  # warm: connections, the result consumer
        echo.delay(i).get(timeout=30)
    rtt = []
    for i in range(serial):
        t0 = time.perf_counter()
        echo.delay(i).get(timeout=30)
        rtt.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    results: list[Any] = [echo.delay(i) for i in range(burst)]
    for res in results:
        res.get(timeout=120)
    wall = time.perf_counter() - t0
    rtt.sort()
    return {"floor_rtt_p50_ms": 1000 * statistics.median(rtt),
            "floor_rtt_p99_ms": 1000 * rtt[min(len(rtt) - 1, int(0.99 * len(rtt)))],
            "floor_tasks_per_s": burst / wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    p.add_argument("--serial", type=int, default=200)
    p.add_argument("--burst", type=int, default=400)
    a = p.parse_args()
    redis.Redis.from_url(a.redis).flushdb()
    import tempfile

    procs: list[Managed] = []
    with tempfile.TemporaryDirectory(prefix="fermix-floor-") as tmp:
        try:
            start(a.redis, Path(tmp), procs)
            for k, v in measure(a.redis, a.serial, a.burst).items():
                print(f"{k:>20}: {v:.2f}")
        finally:
            for proc in procs:
                proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
