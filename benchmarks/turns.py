"""Turn throughput and latency of a real Fermix stack on this machine.

Starts a private redis-server, an in-process scripted OpenAI-compatible model, the gateway and
W ``celery worker`` processes (gevent), fires N turns over C chats at once through
``POST /v1/agent`` and waits for them with ``GET /v1/runs/{id}/wait``. ``--serial`` sends N
messages to ONE chat and measures the queue's handoff (one turn's end to the next one's start).

    .venv/bin/python benchmarks/turns.py --turns 200 --chats 200 --workers 2 --concurrency 100
    .venv/bin/python benchmarks/turns.py --serial --turns 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import redis

from fermix_dev.procs import Managed, free_port, start_redis, wait_until
from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_dev.scripted_llm.script import split_text
from fermix_shared import keys

ANSWER = "This is a simulated answer streamed word by word by the benchmark model."
QUEUE = "fermix.turns"
Metrics = dict[str, float]


# The scripted server sleeps between chunks on asyncio, whose timers wake at the epoll's 1 ms
# granularity: a 31 us gap took a whole ms, so a "1 ms" model streamed its 16 chunks in 17 ms
# (benchmarks/RESULTS.md, issue 31). Gaps shorter than this go before the first byte instead.
MIN_CHUNK_GAP_S = 0.02


def scripted_reply(token: str, delay: float) -> Reply:
    """Half the delay before the first byte, the rest spread over the streamed chunks; all of
    it before the first byte when the gaps would be under MIN_CHUNK_GAP_S."""
    gaps = len(split_text(ANSWER)) + 3  # role, words, finish, usage, [DONE]: n events, n-1 gaps
    if delay / 2 / gaps < MIN_CHUNK_GAP_S:
        return Reply(text=ANSWER, match=token, delay=delay)
    return Reply(text=ANSWER, match=token, delay=delay / 2, chunk_delay=delay / 2 / gaps)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its live descendants (a gateway of several
    processes), from /proc/PID/stat."""
    import psutil

    total = 0.0
    for p in (pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cpu_snapshot(procs: list[Managed]) -> dict[str, float]:
    snap = {p.name: cpu_seconds(p.pid) for p in procs}
    t = os.times()
    snap["bench"] = t.user + t.system  # this process: HTTP client + scripted model thread
    return snap


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def start(args: argparse.Namespace, tmp: Path, llm: ScriptedLLMServer,
          procs: list[Managed], extra_env: dict[str, str] | None = None) -> tuple[str, str]:
    """Redis, gateway and workers (appended to ``procs`` as they start); returns the URLs.
    ``extra_env`` is added to every process's environment (after the defaults)."""
    rproc, redis_url = start_redis(tmp / "redis", log_path=tmp / "redis.log")
    procs.append(rproc)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FERMIX_", "OPENAI_", "ANTHROPIC_"))}
    env.update(FERMIX_REDIS_URL=redis_url, FERMIX_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1",
               FERMIX_PROVIDER="openai", FERMIX_MODEL="bench",
               OPENAI_BASE_URL=llm.openai_base_url, OPENAI_API_KEY="bench-key",
               # The coalesced memory reviews run after a row (not in it: a benchmark chat has
               # one turn, so each would review one turn) and quiesce() waits for them.
               FERMIX_MEMORY_REVIEW_QUIET_SECONDS="15",
               # A benchmark is one sender flooding chats on purpose: no inbound limits.
               FERMIX_LIMITS__MAX_QUEUED_PER_CONVERSATION="0",
               FERMIX_LIMITS__SENDER_MESSAGES_PER_MINUTE="0")
    env.update(extra_env or {})
    port = free_port()
    py = [sys.executable, "-m", "fermix_cli"]
    gw = Managed("gateway", [*py, "gateway", "--port", str(port)], env=env,
                 log_path=tmp / "gateway.log")
    procs.append(gw)
    workers = [Managed(f"bench-w{i + 1}", [*py, "worker", "--concurrency", str(args.concurrency),
                                           "--name", f"bench-w{i + 1}@%h"],
                       env=env, log_path=tmp / f"bench-w{i + 1}.log")
               for i in range(args.workers)]
    procs.extend(workers)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for w in workers:
        def ready(w: Managed = w) -> bool:
            beats = r.hgetall(keys.workers())
            return any(str(k).startswith(f"{w.name}@") and float(v) >= w.started_at
                       for k, v in beats.items())
        wait_until(ready, 90, f"worker {w.name}", w.proc)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 30, "gateway",
               gw.proc)
    r.close()
    return url, redis_url


async def post(client: httpx.AsyncClient, chat: str, text: str) -> dict[str, Any]:
    resp = await client.post("/v1/agent", json={"message": text, "chatId": chat})
    resp.raise_for_status()
    out: dict[str, Any] = resp.json()
    return out


async def wait(client: httpx.AsyncClient, run_id: str, deadline: float) -> dict[str, Any]:
    while True:
        left = max(1.0, deadline - time.monotonic())
        resp = await client.get(f"/v1/runs/{run_id}/wait", params={"timeout": min(60.0, left)})
        resp.raise_for_status()
        out: dict[str, Any] = resp.json()
        if out["status"] != "timeout" or time.monotonic() >= deadline:
            return out


def quiesce(llm: ScriptedLLMServer, r: redis.Redis, limit: float = 90.0) -> None:
    """Until the background work (memory reviews) is done: no review still due, no queued
    task and no new model request for one second. The reviews are coalesced per
    conversation and run once it has been quiet (``FERMIX_MEMORY_REVIEW_QUIET_SECONDS``, 15 s
    in these stacks, so they run after a row, not in it): waiting for them here keeps one
    row's reviews out of the next row."""
    seen, since, end = -1, time.monotonic(), time.monotonic() + limit
    while time.monotonic() < end:
        n = len(llm.script.requests)
        if n != seen or r.llen(QUEUE) or r.zcard(keys.memory_review_due()):
            seen, since = n, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return
        time.sleep(0.1)


async def one_repeat(args: argparse.Namespace, url: str, llm: ScriptedLLMServer,
                     rep: int) -> Metrics:
    n, chats = args.turns, 1 if args.serial else args.chats
    tokens = [f"[r{rep}-{i:06d}]" for i in range(n)]
    llm.script.push(*(scripted_reply(t, args.delay) for t in tokens))
    limits = httpx.Limits(max_connections=args.http_pool, max_keepalive_connections=args.http_pool)
    timeout = httpx.Timeout(90.0, pool=None)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        t0 = time.time()
        if args.serial:  # one at a time, so the inbox order is the send order
            acc = [await post(client, f"r{rep}-serial", f"bench turn {t}") for t in tokens]
        else:
            acc = await asyncio.gather(*(post(client, f"r{rep}-c{i % chats}", f"bench turn {t}")
                                         for i, t in enumerate(tokens)))
        accept_s = time.time() - t0
        deadline = time.monotonic() + args.timeout
        done = await asyncio.gather(*(wait(client, a["runId"], deadline) for a in acc))
    ok = all(d["status"] == "ok" and d.get("endedAt") for d in done)
    ended = [d["endedAt"] / 1000 for d in done if d.get("endedAt")]
    lat = [(d["endedAt"] - a["acceptedAt"]) / 1000 for a, d in zip(acc, done, strict=True)
           if d.get("endedAt")]
    wall = max(ended) - t0 if ended else float("nan")
    m: Metrics = {"wall_s": wall, "turns_per_s": n / wall, "accept_s": accept_s,
                  "lat_p50_s": statistics.median(lat), "lat_p90_s": pct(lat, 0.9),
                  "lat_max_s": max(lat), "ok": float(ok and len(ended) == n)}
    m["overhead_s"] = m["lat_p50_s"] - args.delay
    if args.serial:
        runs = sorted((d for d in done if d.get("startedAt") and d.get("endedAt")),
                      key=lambda d: d["startedAt"])
        gaps = [(b["startedAt"] - a["endedAt"]) / 1000 for a, b in pairwise(runs)]
        m["handoff_p50_s"] = statistics.median(gaps) if gaps else float("nan")
        m["handoff_max_s"] = max(gaps) if gaps else float("nan")
        turn = [(d["endedAt"] - d["startedAt"]) / 1000 for d in runs]
        m["in_turn_overhead_s"] = statistics.median(turn) - args.delay
    return m


def show(label: str, m: Metrics) -> None:
    print(f"{label:>8}: " + "  ".join(f"{k}={v:.3f}" if k != "ok" else f"ok={bool(v)}"
                                      for k, v in m.items()), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--chats", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=100, help="turns per worker process")
    p.add_argument("--delay", type=float, default=1.0, help="simulated provider latency, s")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--serial", action="store_true", help="all turns in ONE chat: handoff cost")
    p.add_argument("--http-pool", type=int, default=32, help="client connections in flight")
    p.add_argument("--timeout", type=float, default=300.0, help="per repeat, s")
    args = p.parse_args()
    if not (0 < args.turns <= 5000 and 0 < args.chats <= 5000 and 0 < args.workers <= 16
            and 0 < args.concurrency <= 2000 and 0 < args.http_pool <= 1000
            and 0 <= args.delay <= 60 and 0 < args.repeat <= 20):
        p.error("counts out of bounds (turns/chats <= 5000, workers <= 16, concurrency <= 2000)")
    procs: list[Managed] = []
    with tempfile.TemporaryDirectory(prefix="fermix-bench-") as tmpdir, \
            ScriptedLLMServer() as llm:
        try:
            url, redis_url = start(args, Path(tmpdir), llm, procs)
            r = redis.Redis.from_url(redis_url, decode_responses=True)
            mode = "serial (1 chat)" if args.serial else f"{args.chats} chats"
            print(f"stack up: {args.workers} worker(s) x concurrency {args.concurrency}; "
                  f"{args.turns} turns, {mode}, delay {args.delay} s", flush=True)
            results: list[Metrics] = []
            for rep in range(args.repeat):
                before = cpu_snapshot(procs)
                m = asyncio.run(one_repeat(args, url, llm, rep))
                quiesce(llm, r)
                after = cpu_snapshot(procs)
                for name, cpu in after.items():
                    if name != "redis" and not name.startswith("bench-w"):
                        m[f"cpu_{name}_s"] = cpu - before[name]
                m["cpu_workers_s"] = sum(after[k] - before[k] for k in after
                                         if k.startswith("bench-w"))
                m["cpu_redis_s"] = after["redis"] - before["redis"]
                m["worker_ms_per_turn"] = 1000 * m["cpu_workers_s"] / args.turns
                m["model_requests"] = float(len(llm.script.requests))
                m["unused_replies"] = float(len(llm.script.pending))
                llm.script.reset()
                results.append(m)
                show(f"run {rep + 1}", m)
            print("summary: median (min-max) over", len(results), "repeats")
            for k in results[0]:
                vals = [x[k] for x in results]
                print(f"  {k:>20}: {statistics.median(vals):9.3f}  "
                      f"({min(vals):.3f}-{max(vals):.3f})")
            r.close()
            return 0 if all(x["ok"] for x in results) else 1
        finally:
            for proc in reversed(procs):
                proc.stop()


if __name__ == "__main__":
    sys.exit(main())
