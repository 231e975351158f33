"""``fermix gateway --processes N``: N uvicorn processes share the port, every request is
answered whichever takes it, ``/metrics`` reports the sum over all of them, and SIGTERM stops
them all.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from fermix_dev.procs import Managed, free_port, wait_until


def _accepted(text: str) -> float:
    m = re.search(r'^fermix_runs_accepted_total\{channel="http"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_two_processes_share_the_port_and_report_one_sum(
    redis_url: str, logs_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, "FERMIX_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "FERMIX_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/13"}
    env.pop("FERMIX_API_TOKEN", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    gw = Managed("gateway-2p", [sys.executable, "-m", "fermix_cli", "gateway", "--port",
                                str(port), "--processes", "2"],
                 env=env, log_path=logs_dir / "gateway-2p.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200,
                   30, "gateway", gw.proc)
        servers = [p for p in psutil.Process(gw.pid).children(recursive=True)
                   if "multiprocessing" in " ".join(p.cmdline())
                   and "resource_tracker" not in " ".join(p.cmdline())]
        assert len(servers) == 2, [p.cmdline() for p in servers]

        # Send until both processes have accepted some (each new connection goes to
        # whichever process takes it first); each writes its counters under its own pid.
        metrics_dir = Path(servers[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
        pids = {str(p.pid) for p in servers}

        def writers() -> set[str]:
            """The processes that have counted an accepted message (read from a copy of each
            one's counter file alone, with prometheus-client's own collector)."""
            out = set()
            for pid in pids:
                one = tmp_path / f"one-{pid}"
                one.mkdir(exist_ok=True)
                src = metrics_dir / f"counter_{pid}.db"
                if not src.exists():
                    continue
                shutil.copy(src, one / src.name)
                registry = CollectorRegistry()
                MultiProcessCollector(registry, path=str(one))
                if _accepted(generate_latest(registry).decode()) > 0:
                    out.add(pid)
            return out

        n = 0
        while not pids <= writers() and n < 400:
            resp = httpx.post(f"{url}/v1/agent", json={"message": f"hi {n}",
                                                       "chatId": f"procs-{n}"}, timeout=10)
            assert resp.status_code == 202, resp.text
            n += 1
        assert pids <= writers(), f"after {n} requests only {writers()} of {pids} accepted"
        scrapes = {_accepted(httpx.get(f"{url}/metrics", timeout=5).text) for _ in range(10)}
        assert scrapes == {float(n)}, f"each scrape must count all {n} accepts: {scrapes}"

        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(15) == 0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)
    finally:
        gw.stop()


@pytest.mark.parametrize(("argv", "env", "shown"), [
    (["--processes", "0"], {}, "'0' (from --processes"),
    (["--processes", "65"], {}, "'65' (from --processes"),
    ([], {"FERMIX_GATEWAY_PROCESSES": "two"}, "'two' (from --processes or FERMIX_GATEWAY_PROCESSES)"),
])
def test_a_bad_process_count_is_a_sentence_and_exit_2(
    argv: list[str], env: dict[str, str], shown: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fermix_cli", "gateway", "--port", str(free_port()), *argv],
        env={**os.environ, "FERMIX_HOME": str(tmp_path), **env}, capture_output=True, text=True,
        timeout=20)
    assert proc.returncode == 2, proc.stderr
    assert "expected a number of gateway processes from 1 to 64, not " + shown in proc.stderr


def test_a_bad_process_count_in_the_environment_leaves_other_commands_alone(
    tmp_path: Path,
) -> None:
    proc = subprocess.run([sys.executable, "-m", "fermix_cli", "--help"],
                          env={**os.environ, "FERMIX_HOME": str(tmp_path),
                               "FERMIX_GATEWAY_PROCESSES": "two"},
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
