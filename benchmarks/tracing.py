"""What tracing adds to a turn: the same turns on two identical stacks, one with tracing off
(no ``OTEL_*``) and one exporting every span over OTLP/HTTP to a fake collector on 127.0.0.1
(fermix_dev/otlp_collector.py, in this process).

Each stack is a private redis-server, a gateway and one ``celery worker`` (gevent), as
``benchmarks/turns.py`` starts them, over one in-process scripted model. A row is N turns over
N chats through ``POST /v1/agent``, ``--parallel`` at a time (the worker is not saturated, so
latency shows overhead rather than queueing), each one streamed model call of ``--delay`` s; rows
alternate between the stacks so drift hits both alike. Per row: the worker's and the gateway's
CPU per turn (``/proc``, from the first POST until every turn ended and, tracing on, until the
collector had every turn's spans: the export is counted) and the turns' latency
(``endedAt - acceptedAt``). Reported: median and spread (min-max) of the rows, off and on, and
of the paired differences. Memory reviews are held off for the run (they are not the turn).

    .venv/bin/python -m benchmarks.tracing --turns 100 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.turns import cpu_seconds, pct
from benchmarks.turns import start as start_stack
from fermix_dev.otlp_collector import CollectedSpan, OTLPCollector
from fermix_dev.procs import Managed
from fermix_dev.scripted_llm import Reply, ScriptedLLMServer

Row = dict[str, float]


async def _turns(url: str, tag: str, n: int, parallel: int) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    in_flight = asyncio.Semaphore(parallel)
    async with httpx.AsyncClient(base_url=url, limits=limits,
                                 timeout=httpx.Timeout(90.0, pool=None)) as client:
        async def one(i: int) -> dict[str, Any]:
            async with in_flight:
                return await _turn(client, tag, i)

        return await asyncio.gather(*(one(i) for i in range(n)))


async def _turn(client: httpx.AsyncClient, tag: str, i: int) -> dict[str, Any]:
    resp = await client.post("/v1/agent", json={"message": f"bench {tag}-{i:05d}",
                                                 "chatId": f"{tag}-{i}"})
    resp.raise_for_status()
    done = await client.get(f"/v1/runs/{resp.json()['runId']}/wait", params={"timeout": 60})
    done.raise_for_status()
    out: dict[str, Any] = {**done.json(), "acceptedAt": resp.json()["acceptedAt"]}
    return out


def row(url: str, procs: dict[str, Managed], llm: ScriptedLLMServer, tag: str, n: int,
        delay: float, collector: OTLPCollector | None, parallel: int = 10) -> Row:
    llm.script.push(*(Reply(text="a short benchmark answer", delay=delay,
                            match=f"{tag}-{i:05d}") for i in range(n)))
    before = {k: cpu_seconds(p.pid) for k, p in procs.items()}
    done = asyncio.run(_turns(url, tag, n, parallel))
    if collector is not None:  # the export is part of what tracing costs
        def exported(spans: list[CollectedSpan]) -> bool:
            return sum(1 for s in spans if s.name == "fermix.deliver"
                       and str(s.attributes.get("fermix.run_id", "")) in ids) >= n

        ids = {d["runId"] for d in done}
        collector.wait_for(exported, timeout=60)
    after = {k: cpu_seconds(p.pid) for k, p in procs.items()}
    assert all(d["status"] == "ok" for d in done), [d["status"] for d in done]
    lat = [(d["endedAt"] - d["acceptedAt"]) / 1000 - delay for d in done]
    return {"worker_ms": 1000 * (after["worker"] - before["worker"]) / n,
            "gateway_ms": 1000 * (after["gateway"] - before["gateway"]) / n,
            "overhead_p50_ms": 1000 * statistics.median(lat),
            "overhead_p90_ms": 1000 * pct(lat, 0.9)}


def summary(label: str, rows: list[Row]) -> None:
    print(f"{label}:")
    for k in rows[0]:
        vals = [r[k] for r in rows]
        print(f"  {k:>16}: median {statistics.median(vals):8.2f}  "
              f"({min(vals):.2f}-{max(vals):.2f})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=100, help="turns per row")
    p.add_argument("--repeat", type=int, default=5, help="rows per stack")
    p.add_argument("--delay", type=float, default=0.2, help="simulated model latency, s")
    p.add_argument("--parallel", type=int, default=10, help="turns in flight at once")
    p.add_argument("--concurrency", type=int, default=100, help="the worker's pool")
    a = p.parse_args()
    if not (0 < a.turns <= 2000 and 0 < a.repeat <= 20 and 0 <= a.delay <= 10
            and 0 < a.parallel <= 500):
        p.error("out of bounds (turns <= 2000, repeat <= 20, delay <= 10, parallel <= 500)")
    stack_args = argparse.Namespace(workers=1, concurrency=a.concurrency)
    base = {"FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "3600"}
    procs: list[Managed] = []
    with tempfile.TemporaryDirectory(prefix="fermix-bench-tracing-") as tmp, \
            ScriptedLLMServer() as llm, OTLPCollector() as collector:
        try:
            stacks = {}
            for mode, env in (("off", base), ("on", {
                    **base, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                    "OTEL_BSP_SCHEDULE_DELAY": "500"})):
                mine: list[Managed] = []
                (Path(tmp) / mode).mkdir()
                url, _ = start_stack(stack_args, Path(tmp) / mode, llm, mine, env)
                procs.extend(mine)
                named = {"gateway": next(m for m in mine if m.name == "gateway"),
                         "worker": next(m for m in mine if m.name.startswith("bench-w"))}
                stacks[mode] = (url, named)
            print(f"two stacks up; rows of {a.turns} turns (delay {a.delay} s), "
                  f"{a.repeat} per stack", flush=True)
            for mode, (url, named) in stacks.items():  # warm-up: pools, first imports
                row(url, named, llm, f"warm-{mode}", 20, a.delay,
                    collector if mode == "on" else None)
            rows: dict[str, list[Row]] = {"off": [], "on": []}
            for rep in range(a.repeat):
                for mode, (url, named) in stacks.items():
                    got = row(url, named, llm, f"r{rep}-{mode}", a.turns, a.delay,
                              collector if mode == "on" else None, a.parallel)
                    rows[mode].append(got)
                    print(f"row {rep + 1} {mode:>3}: " + "  ".join(
                        f"{k}={v:.2f}" for k, v in got.items()), flush=True)
                collector.clear()
            summary("tracing off", rows["off"])
            summary("tracing on (exporting)", rows["on"])
            summary("added by tracing (on - off, paired rows)", [
                {k: on[k] - off[k] for k in on} for off, on in zip(rows["off"], rows["on"],
                                                                  strict=True)])
            return 0
        finally:
            for proc in reversed(procs):
                proc.stop()


if __name__ == "__main__":
    t0 = time.monotonic()
    code = main()
    print(f"done in {time.monotonic() - t0:.0f} s")
    sys.exit(code)
