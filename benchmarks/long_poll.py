"""Long-poll capacity of one gateway: N concurrent ``GET /v1/runs/{id}/wait`` (issue 25 item 7).

Starts a private redis-server and one ``fermix gateway`` (no worker: this process writes the
runs' records and end events, as a worker would, so every run ends at a known time). Two
measurements, both through the official ``httpx`` client, pooled:

- ``waits``: N runs, N concurrent waits on one ``AsyncClient`` (a pool of N connections,
  first used for N ``GET /v1/runs/{id}``; ``--clients K`` spreads them over K clients),
  every run ended ``--end-after`` s after the waits started. Reports answers by outcome
  (200 ok, 503, a connection error), how long after the end the waits answered (min,
  median, max), and the CPU of the gateway and of this process. One httpx pool of 1,000
  connections costs its client seconds of CPU per burst of answers (httpcore walks its
  connection list for every connection on each request's end): compare ``client_cpu_s``
  before reading the latencies as the gateway's.
- ``keepalive``: ``--probes`` clients each reuse their pooled connection after ``--idle`` s
  (just under httpx's 5 s ``keepalive_expiry``), three times, while other processes keep the
  gateway busy with bursts of reads. Reports answers by outcome: a ``RemoteProtocolError`` /
  ``ReadError`` is the gateway closing the idle connection under the request.

Run from the checkout to measure: ``.venv/bin/python benchmarks/long_poll.py [--waits 1000]
[--end-after 6] [--probes 50] [--idle 4.9] [--load 2] [--repeat 1]``. The gateway is started
with the working directory's code, so the same script measures an older checkout when run
from it (``cd old && ../main/.venv/bin/python ../main/benchmarks/long_poll.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())

import httpx  # noqa: E402
import redis  # noqa: E402

from fermix_dev.procs import Managed, free_port, start_redis, wait_until  # noqa: E402
from fermix_shared import keys  # noqa: E402
from fermix_shared.models import ConversationKey, RunRecord, RunStatus, now  # noqa: E402
from fermix_shared.stores import runs  # noqa: E402

KEY = ConversationKey(channel="http", chat_id="bench")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of the process group ``pid`` leads."""
    out = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout
    total = 0.0
    for p in out.split():
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _own_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _end_all(r: redis.Redis, ids: list[str]) -> None:
    pipe = r.pipeline(transaction=False)
    for run_id in ids:
        rec = RunRecord(run_id=run_id, conversation=KEY, status=RunStatus.ok, reply="done",
                        ended_at=now())
        pipe.set(keys.run(run_id), rec.model_dump_json())
        pipe.xadd(keys.run_events(run_id), {"stream": "lifecycle",
                                            "data": '{"phase": "end", "status": "ok"}'})
    pipe.execute()


async def waits(base: str, r: redis.Redis, gateway: Managed, n: int, end_after: float,
                clients: int) -> dict[str, Any]:
    ids = [f"bench-{time.monotonic_ns()}-{i}" for i in range(n)]
    for run_id in ids:
        runs.put(r, RunRecord(run_id=run_id, conversation=KEY, status=RunStatus.running))
    per = -(-n // clients)
    limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
    outcomes: collections.Counter[str] = collections.Counter()
    answered_at: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(
            httpx.AsyncClient(base_url=base, timeout=60, limits=limits)) for _ in range(clients)]
        by_run = {run_id: pool[k % clients] for k, run_id in enumerate(ids)}
        await asyncio.gather(*(by_run[i].get(f"/v1/runs/{i}") for i in ids))  # a warm pool
        cpu0, client_cpu0 = _cpu(gateway.pid), _own_cpu()
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def end() -> None:
            _end_all(r, ids)
            loop.call_soon_threadsafe(ended.set_result, time.monotonic())

        loop.call_later(end_after, lambda: loop.run_in_executor(None, end))

        async def one(run_id: str) -> None:
            try:
                resp = await by_run[run_id].get(f"/v1/runs/{run_id}/wait",
                                                params={"timeout": 60})
                body = resp.json() if resp.status_code == 200 else {}
                outcomes[f"{resp.status_code} {body.get('status', '')}".strip()] += 1
            except httpx.HTTPError as e:
                outcomes[type(e).__name__] += 1
            answered_at.append(time.monotonic())

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in ids))
        end_at = await ended
    late = sorted(t - end_at for t in answered_at)
    return {"outcomes": dict(outcomes), "wall_s": round(time.monotonic() - started, 2),
            "after_end_min_s": round(late[0], 2),
            "after_end_p50_s": round(statistics.median(late), 2),
            "after_end_max_s": round(late[-1], 2),
            "gateway_cpu_s": round(_cpu(gateway.pid) - cpu0, 2),
            "client_cpu_s": round(_own_cpu() - client_cpu0, 2), "clients": clients}


_LOAD = """
import asyncio, httpx
async def main():
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    async with httpx.AsyncClient(base_url={base!r}, timeout=60, limits=limits) as c:
        while True:
            await asyncio.gather(*(c.get("/v1/runs/bench-done") for _ in range(300)),
                                 return_exceptions=True)
asyncio.run(main())
"""


async def keepalive(base: str, r: redis.Redis, probes: int, idle: float, load: int
                    ) -> dict[str, Any]:
    runs.put(r, RunRecord(run_id="bench-done", conversation=KEY, status=RunStatus.ok))
    busy = [subprocess.Popen([sys.executable, "-c", _LOAD.format(base=base)])
            for _ in range(load)]
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        await asyncio.sleep(2)  # the load running

        async def probe() -> None:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                for _ in range(3):
                    try:
                        await client.get("/v1/runs/bench-done")
                        await asyncio.sleep(idle)
                        outcomes[str((await client.get("/v1/runs/bench-done")).status_code)] += 1
                    except httpx.HTTPError as e:
                        outcomes[type(e).__name__] += 1

        await asyncio.gather(*(probe() for _ in range(probes)))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return {"outcomes": dict(outcomes), "idle_s": idle, "load_processes": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waits", type=int, default=1000)
    ap.add_argument("--end-after", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=1,
                    help="httpx clients the waits are spread over (each pooled)")
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--idle", type=float, default=4.9)
    ap.add_argument("--load", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", choices=("waits", "keepalive"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fermix-long-poll-") as tmp:
        root = Path(tmp)
        redis_proc, url = start_redis(root / "redis", log_path=root / "redis.log")
        port = free_port()
        env = {**os.environ, "FERMIX_REDIS_URL": url, "FERMIX_HOME": str(root / "home"),
               "PYTHONUNBUFFERED": "1"}
        gateway = Managed("gateway", [sys.executable, "-m", "fermix_cli", "gateway", "--port",
                                      str(port)], env=env, log_path=root / "gateway.log")
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: httpx.get(f"{base}/healthz", timeout=1).status_code == 200, 30,
                       "gateway", gateway.proc)
            r = redis.Redis.from_url(url, decode_responses=True)
            for i in range(a.repeat):
                if a.only in (None, "waits"):
                    print(f"run {i + 1} waits={a.waits}",
                          asyncio.run(waits(base, r, gateway, a.waits, a.end_after,
                                            a.clients)), flush=True)
                if a.only in (None, "keepalive"):
                    print(f"run {i + 1} keepalive probes={a.probes}",
                          asyncio.run(keepalive(base, r, a.probes, a.idle, a.load)), flush=True)
            errors = [line for line in (root / "gateway.log").read_text().splitlines()
                      if "ERROR" in line or "WARNING" in line]
            reasons = collections.Counter(line.split(": ", 2)[-1] for line in errors)
            print("gateway errors:", dict(reasons.most_common(5)) or "none")
        finally:
            gateway.stop()
            redis_proc.stop()


if __name__ == "__main__":
    main()
