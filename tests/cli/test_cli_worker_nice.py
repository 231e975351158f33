"""``fermix worker --nice N`` / ``FERMIX_WORKER_NICE``: the worker runs at the CPU priority asked
for (so a gateway on the same host keeps answering while workers are busy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis

from fermix_dev.procs import Managed, wait_until


def worker(name: str, env: dict[str, str], *args: str) -> Managed:
    return Managed(name, [sys.executable, "-m", "fermix_cli", "worker", "--concurrency", "2",
                          "--name", f"{name}@%h", *args], env=env)


def celery_started(w: Managed) -> bool:
    """The CLI has exec'd Celery (the same process: the niceness is set just before)."""
    return b"celery" in Path(f"/proc/{w.pid}/cmdline").read_bytes()


def test_the_worker_runs_at_the_niceness_asked_for(
    r: redis.Redis, scratch_redis_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "FERMIX_REDIS_URL": scratch_redis_url, "FERMIX_HOME": str(tmp_path)}
    env.pop("FERMIX_WORKER_NICE", None)
    flagged = worker("nice7", env, "--nice", "7")
    from_env = worker("nice4", {**env, "FERMIX_WORKER_NICE": "4"})
    plain = worker("nice0", env)
    try:
        for w in (flagged, from_env, plain):
            wait_until(lambda w=w: celery_started(w), 60, w.name, w.proc)
        ours = os.getpriority(os.PRIO_PROCESS, 0)  # inherited; a worker never raises it
        assert os.getpriority(os.PRIO_PROCESS, flagged.pid) == max(ours, 7)
        assert os.getpriority(os.PRIO_PROCESS, from_env.pid) == max(ours, 4)
        assert os.getpriority(os.PRIO_PROCESS, plain.pid) == ours
    finally:
        for w in (flagged, from_env, plain):
            w.kill()
            w.proc.wait(10)


def test_a_bad_niceness_is_refused_with_a_sentence(tmp_path: Path) -> None:
    env = {**os.environ, "FERMIX_HOME": str(tmp_path), "FERMIX_WORKER_NICE": "low"}
    out = subprocess.run([sys.executable, "-m", "fermix_cli", "worker"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert ("argument --nice: expected a niceness from 0 (normal) to 19 (lowest priority), "
            "not 'low' (from --nice or FERMIX_WORKER_NICE)") in out.stderr
    out = subprocess.run([sys.executable, "-m", "fermix_cli", "worker", "--nice", "25"],
                         env={**env, "FERMIX_WORKER_NICE": "3"}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "not '25'" in out.stderr
