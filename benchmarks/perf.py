"""Issue 17's table for Fermix, in one command: every row, median and spread over ``--repeat``.

One private stack (redis-server, the in-process scripted model, the gateway, 2 gevent workers ×
64 slots; ``benchmarks/turns.py``'s helpers) serves every row, after the floor is measured on
its Redis (``benchmarks/floor.py``: a trivial Celery task, 2 gevent workers × 64; ``floor_*``,
and ``a_x_floor``/``b_x_floor``: row a's client p50 over the floor's round trip, row b's
turns/s over the floor's tasks/s):

  a. one turn at a time, accept → reply, p50/p99 (model ~1 ms)
  b. turns/s over many chats (model ~1 ms), plus model calls per turn and Redis commands per turn
  c. N turns on a 2 s model: turns/s and the most turns in flight at once
  d. webhook ack latency: 16 senders on ``POST /webhooks/telegram`` while turns run, 100
     webhooks/s while N turns start at once and while 300 slow turns (a 6 s model) run
     (``d_slow100_*``), and the gateway alone at a target rate (a stranger's message: audited,
     dropped, no platform call)
  e. subagent fan-out, 10 tasks × 1 s, cap 4: spread of the start times, largest gap between a
     slot release and the next start
  f. 1,000 slow turns (a 30 s model) into one worker process with 1,000 slots (a stack of its
     own): the most in flight at once, turns/s, and the worker's peak resident memory
  g. the same for 600 turns on a 6 s model (issue 31's row): their wall time (``g_wall_s``)

Workers run at nice 10 (``FERMIX_WORKER_NICE``), the layout ``fermix dev`` uses, so the gateway
on the same cores answers first.

    .venv/bin/python benchmarks/perf.py              # full sizes, 3 repeats
    .venv/bin/python benchmarks/perf.py --quick      # 1 repeat, small sizes (~1-2 min)
    .venv/bin/python benchmarks/perf.py --quick --profile /tmp/prof   # rows a+b under py-spy
    .venv/bin/python benchmarks/perf.py --waterfall  # where the serial turn's time goes

``--profile DIR`` runs the gateway and the workers under ``py-spy record`` (pip install py-spy;
py-spy must be their parent here: attaching by pid is refused on this box) and prints the top
self and cumulative costs per process (start-up imports filtered out). Only rows a and b run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import contextlib

from benchmarks import floor, loadgen, turns  # noqa: E402
from fermix_dev.procs import Managed  # noqa: E402
from fermix_dev.scripted_llm import Reply, ScriptedLLMServer  # noqa: E402
from fermix_dev.scripted_llm.script import ToolCallSpec  # noqa: E402

TG_SECRET = "bench-telegram-secret"
FAST = 0.001  # the "~1 ms" model
Row = dict[str, float]

FULL = {"a_turns": 100, "b_turns": 400, "c_turns": 400, "d_turns": 400, "d_alone_s": 10.0,
        "e_runs": 1, "f_turns": 1000, "f_delay_s": 30.0, "g_turns": 600, "g_delay_s": 6.0}
QUICK = {"a_turns": 20, "b_turns": 100, "c_turns": 100, "d_turns": 100, "d_alone_s": 3.0,
         "e_runs": 1, "f_turns": 300, "f_delay_s": 15.0, "g_turns": 600, "g_delay_s": 6.0}
# Workers run niced, as `fermix dev` runs them: on a shared host the gateway goes first.
WORKER_NICE = "10"


# --- machine -------------------------------------------------------------------------------

def machine(redis_url: str) -> dict[str, str]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal"))
    pkgs = {}
    for name in ("celery", "kombu", "gevent", "redis", "openai", "uvicorn", "fastapi", "httpx",
                 "pydantic", "orjson"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pkgs[name] = importlib.metadata.version(name)
    repo = Path(__file__).resolve().parent.parent
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except OSError:
            return "?"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    r = redis.Redis.from_url(redis_url)
    rv = r.info("server")["redis_version"]
    r.close()
    return {"nproc": str(os.cpu_count()), "cpu": cpu, "ram": f"{mem_kb / 1024 / 1024:.1f} GiB",
            "kernel": platform.release(), "python": platform.python_version(),
            "redis-server": str(rv), "packages": ", ".join(f"{k} {v}" for k, v in pkgs.items()),
            "commit": git("rev-parse", "--short", "HEAD") + (" (+uncommitted changes)" if dirty
                                                              else ""),
            "loadavg at start": " ".join(Path("/proc/loadavg").read_text().split()[:3])}


# --- helpers -------------------------------------------------------------------------------

def client(url: str, pool: int = 32) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0, pool=None),
                             limits=httpx.Limits(max_connections=pool,
                                                 max_keepalive_connections=pool))


async def fire(url: str, llm: ScriptedLLMServer, tag: str, n: int, delay: float,
               ) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """n turns over n chats at once; returns (t0, accepts, ends)."""
    tokens = [f"[{tag}-{i:05d}]" for i in range(n)]
    llm.script.push(*(turns.scripted_reply(t, delay) for t in tokens))
    async with client(url) as c:
        t0 = time.time()
        acc = await asyncio.gather(*(turns.post(c, f"{tag}-c{i}", f"bench turn {t}")
                                     for i, t in enumerate(tokens)))
        deadline = time.monotonic() + 300
        done = await asyncio.gather(*(turns.wait(c, a["runId"], deadline) for a in acc))
    return t0, acc, done


def max_in_flight(done: list[dict[str, Any]]) -> int:
    edges = sorted([(d["startedAt"], 1) for d in done if d.get("startedAt")]
                   + [(d["endedAt"], -1) for d in done if d.get("endedAt")],
                   key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, step in edges:
        cur += step
        best = max(best, cur)
    return best


def all_ok(done: list[dict[str, Any]]) -> float:
    return float(all(d["status"] == "ok" and d.get("endedAt") for d in done))


def commandstats(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in r.info("commandstats").items()}


# --- rows ----------------------------------------------------------------------------------

async def row_a(url: str, llm: ScriptedLLMServer, n: int, rep: int) -> Row:
    """One turn at a time (each in its own chat), accept → reply."""
    server, client_side = [], []
    tokens = [f"[a{rep}-{i:04d}]" for i in range(n)]
    llm.script.push(*(turns.scripted_reply(t, FAST) for t in tokens))
    async with client(url, 4) as c:
        for i, t in enumerate(tokens):
            t0 = time.perf_counter()
            a = await turns.post(c, f"a{rep}-{uuid.uuid4().hex[:6]}-{i}", f"bench turn {t}")
            d = await turns.wait(c, a["runId"], time.monotonic() + 60)
            client_side.append(time.perf_counter() - t0)
            if d.get("endedAt"):
                server.append((d["endedAt"] - a["acceptedAt"]) / 1000)
    return {"a_server_p50_ms": 1000 * statistics.median(server),
            "a_server_p99_ms": 1000 * turns.pct(server, 0.99),
            "a_client_p50_ms": 1000 * statistics.median(client_side),
            "a_client_p99_ms": 1000 * turns.pct(client_side, 0.99),
            "a_ok": float(len(server) == n)}


async def row_b(url: str, llm: ScriptedLLMServer, n: int, rep: int) -> Row:
    t0, acc, done = await fire(url, llm, f"b{rep}", n, FAST)
    wall = max(d["endedAt"] for d in done if d.get("endedAt")) / 1000 - t0
    lat = [(d["endedAt"] - a["acceptedAt"]) / 1000 for a, d in zip(acc, done, strict=True)
           if d.get("endedAt")]
    return {"b_turns_per_s": n / wall, "b_wall_s": wall, "b_lat_p50_s": statistics.median(lat),
            "b_lat_p99_s": turns.pct(lat, 0.99), "b_ok": all_ok(done)}


async def row_c(url: str, llm: ScriptedLLMServer, n: int, rep: int) -> Row:
    t0, acc, done = await fire(url, llm, f"c{rep}", n, 2.0)
    wall = max(d["endedAt"] for d in done if d.get("endedAt")) / 1000 - t0
    return {"c_turns_per_s": n / wall, "c_wall_s": wall, "c_max_in_flight": max_in_flight(done),
            "c_ok": all_ok(done)}


def tg_update(update_id: int, sender: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1441645532, "text": f"hello {update_id}",
        "from": {"id": sender, "is_bot": False, "first_name": "Stranger"},
        "chat": {"id": sender, "type": "private"}}}


LOAD_RATE = 100.0  # row d: webhooks/s beside the turn load, open loop
SLOW_TURNS, SLOW_DELAY_S = 300, 6.0  # row d: the slow turns the webhooks run beside
HEADERS = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET, "Content-Type": "application/json"}
_update_ids = iter(range(10_000_000, 10**9))


async def acks_under_load(url: str, llm: ScriptedLLMServer, n: int, tag: str,
                          rate: float | None, delay: float = FAST
                          ) -> tuple[list[float], float, float]:
    """Webhook ack latencies while n fast turns run: 16 senders on keep-alive connections,
    closed loop (``rate`` None: each sends again as soon as it is answered) or open loop at
    ``rate`` req/s in all. The senders live in a process of their own: in this one, starting
    n requests at once stalls the event loop for ~0.5 s, and that stall (the benchmark's, not
    the gateway's) was what the p99 measured. Returns (latencies s, span s, all turns ok)."""
    argv = [sys.executable, str(Path(__file__).with_name("loadgen.py")), "telegram-senders", url,
            TG_SECRET, "16", "--first-update-id", str(next(_update_ids) * 1000)]
    senders = await asyncio.create_subprocess_exec(
        *argv, *(["--rate", str(rate)] if rate else []), stdout=asyncio.subprocess.PIPE)
    assert senders.stdout is not None
    if (await senders.stdout.readline()).strip() != b"ready":
        raise RuntimeError("the webhook senders did not start")
    t0, _, done = await fire(url, llm, tag, n, delay)
    t1 = time.time()
    senders.send_signal(signal.SIGTERM)
    out_line, _ = await senders.communicate()
    lat = [took for at, took in json.loads(out_line) if t0 <= at <= t1]  # while the turns ran
    return lat, t1 - t0, all_ok(done)


async def row_d(url: str, llm: ScriptedLLMServer, n: int, alone_s: float, rate: float,
                rep: int, gateway_pid: int) -> Row:
    lat, span, ok = await acks_under_load(url, llm, n, f"d{rep}", None)
    out = {"d_load_ack_p50_ms": 1000 * statistics.median(lat),
           "d_load_ack_p99_ms": 1000 * turns.pct(lat, 0.99), "d_load_req_per_s": len(lat) / span,
           "d_load_turns_ok": ok}
    await asyncio.sleep(1.0)
    # The same turn load with the webhooks at a fixed 100 req/s (what the 16 senders
    # achieved before): a faster gateway no longer means more webhook load.
    lat, span, ok = await acks_under_load(url, llm, n, f"d{rep}r", LOAD_RATE)
    out |= {"d_load100_ack_p50_ms": 1000 * statistics.median(lat),
            "d_load100_ack_p99_ms": 1000 * turns.pct(lat, 0.99),
            "d_load100_req_per_s": len(lat) / span, "d_load100_turns_ok": ok}
    # Issue 31, item 3: the same 100 webhooks/s while 300 slow turns (a 6 s model) run: the
    # acks must not wait for the turns however long they hold the workers.
    await asyncio.sleep(1.0)
    lat, span, ok = await acks_under_load(url, llm, SLOW_TURNS, f"d{rep}s", LOAD_RATE,
                                          SLOW_DELAY_S)
    out |= {"d_slow100_ack_p50_ms": 1000 * statistics.median(lat),
            "d_slow100_ack_p99_ms": 1000 * turns.pct(lat, 0.99),
            "d_slow100_req_per_s": len(lat) / span, "d_slow100_turns_ok": ok}
    # Alone: open loop at `rate` on raw keep-alive sockets (httpx's pool would be the
    # bottleneck), latency from the scheduled send time (no coordinated omission).
    await asyncio.sleep(1.0)
    cpu0 = turns.cpu_seconds(gateway_pid)
    alone, span = await loadgen.open_loop(
        url, "/webhooks/telegram", HEADERS,
        lambda k: json.dumps(tg_update(next(_update_ids), 8_000_000 + k % 50)).encode(),
        rate, int(rate * alone_s))
    total = len(alone)
    out.update({"d_alone_gateway_cpu_ms_per_webhook":
                1000 * (turns.cpu_seconds(gateway_pid) - cpu0) / total,
                "d_alone_p50_ms": 1000 * statistics.median(alone),
                "d_alone_p99_ms": 1000 * turns.pct(alone, 0.99),
                "d_alone_req_per_s": total / span})
    return out


def sse_events(url: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    with httpx.Client(base_url=url, timeout=60) as http, \
            http.stream("GET", f"/v1/runs/{run_id}/events") as resp:
        event = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                out.append((event, json.loads(line[5:])))
    return out


async def row_e(url: str, llm: ScriptedLLMServer, rep: int, seconds: float = 1.0,
                cap: int = 4) -> Row:
    user = f"fan-{rep}-{uuid.uuid4().hex[:8]}"
    tasks = [f"slice{i}-{uuid.uuid4().hex[:8]}" for i in range(10)]
    llm.script.push(Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks})], match=user),
                    *[Reply(text=f"found {t}", delay=seconds, match=t) for t in tasks],
                    Reply(text=f"synthesized for {user}", match=user))
    async with client(url, 4) as c:
        a = await turns.post(c, f"e{rep}-{uuid.uuid4().hex[:6]}", user)
        d = await turns.wait(c, a["runId"], time.monotonic() + 120)
    ends = [e for k, e in await asyncio.to_thread(sse_events, url, a["runId"])
            if k == "diagnostic" and e.get("kind") == "subagents" and e.get("phase") == "end"]
    if d["status"] != "ok" or not ends:
        return {"e_ok": 0.0}
    ts = ends[0]["tasks"]
    starts = sorted(t["startedAt"] for t in ts)
    stops = sorted(t["endedAt"] for t in ts)
    # The k-th start after the first `cap` took the slot the k-th release freed.
    gaps = [s - e for s, e in zip(starts[cap:], stops, strict=False)]
    return {"e_start_spread_s": starts[-1] - starts[0], "e_span_s": stops[-1] - starts[0],
            "e_max_refill_gap_ms": 1000 * max(gaps), "e_median_refill_gap_ms":
            1000 * statistics.median(gaps),
            "e_ok": float(d["status"] == "ok" and all(t["status"] == "completed" for t in ts))}


def row_f(tmp: Path, llm: ScriptedLLMServer, n: int, delay: float, rep: int,
          prefix: str = "f", profile: Path | None = None) -> Row:
    """n slow turns into ONE worker process with n slots, on a stack of its own: the most
    turns in flight at once and the worker's peak resident memory. The model answers in
    ``delay`` s: long enough for all n to be started (one process starts a few dozen turns a
    second, so a 2 s model never has 1,000 in flight at once)."""
    import threading

    import psutil

    procs: list[Managed] = []
    peak = [0]
    stop = threading.Event()
    try:
        url, _ = turns.start(argparse.Namespace(workers=1, concurrency=n), tmp / f"{prefix}{rep}",
                             llm,
                             procs, extra_env={"FERMIX_WORKER_NICE": WORKER_NICE})
        worker = psutil.Process(next(p.pid for p in procs if p.name.startswith("bench-w")))

        def sample() -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], worker.memory_info().rss)
        threading.Thread(target=sample, daemon=True).start()
        rss0 = worker.memory_info().rss
        t0, acc, done = asyncio.run(fire(url, llm, f"{prefix}{rep}", n, delay))
        stop.set()
        wall = max(d["endedAt"] for d in done if d.get("endedAt")) / 1000 - t0
        return {f"{prefix}_max_in_flight": max_in_flight(done), f"{prefix}_turns_per_s": n / wall,
                f"{prefix}_wall_s": wall, f"{prefix}_worker_rss_idle_mb": rss0 / 2**20,
                f"{prefix}_worker_rss_peak_mb": peak[0] / 2**20, f"{prefix}_ok": all_ok(done)}
    finally:
        stop.set()
        if profile is not None:  # this stack's py-spy files, kept apart from the main stack's
            stop_profilers(procs)
            for proc in procs:
                if (out := profile / f"{proc.name}.txt").exists():
                    out.rename(profile / f"{prefix}{rep}-{proc.name}.txt")
        for proc in reversed(procs):
            proc.stop()


# --- profile -------------------------------------------------------------------------------

def profiled(procs: list[Managed], out_dir: Path) -> None:
    """Wrap the gateway's and the workers' argv in ``py-spy record`` (they are not started
    yet: this replaces ``Managed.__init__`` for the names turns.start uses)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    orig = Managed.__init__

    def init(self: Managed, name: str, argv: list[str], env: dict[str, str] | None = None,
             log_path: Path | None = None) -> None:
        if name.startswith("bench-w"):  # `fermix worker` execs celery: py-spy loses it
            from fermix_cli.main import CELERY_APP
            conc, node = argv[argv.index("--concurrency") + 1], argv[argv.index("--name") + 1]
            env = {**(env or {}), "FERMIX_WORKER_CONCURRENCY": conc}
            argv = [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "-P", "gevent",
                    "-c", conc, "-E", "-l", "INFO", "-Q", turns.QUEUE, "-n", node]
        if name == "gateway" or name.startswith("bench-w"):
            argv = [spy, "record", "--rate", "250", "--format", "raw", "--nonblocking",
                    "-o", str(out_dir / f"{name}.txt"), "--", *argv]
        orig(self, name, argv, env, log_path)
    Managed.__init__ = init  # type: ignore[method-assign]


def stop_profilers(procs: list[Managed]) -> None:
    """SIGINT to each py-spy only: it writes its file and ends the process it profiles."""
    for p in procs:
        if p.name == "gateway" or p.name.startswith("bench-w"):
            os.kill(p.pid, signal.SIGINT)
    for p in procs:
        if p.name == "gateway" or p.name.startswith("bench-w"):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(30)


STARTUP = ("_find_and_load",)  # imports at start-up (and lazy ones)


def summarize(path: Path, top: int, turns_n: int, cpu_s: float) -> str:
    """Self and cumulative sample shares from py-spy's raw (collapsed) output."""
    selfc: collections.Counter[str] = collections.Counter()
    cum: collections.Counter[str] = collections.Counter()
    pkg: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or any(s in stack for s in STARTUP):
            continue
        count = int(n)
        frames = stack.split(";")
        total += count
        selfc[frames[-1]] += count
        for f in set(frames):
            cum[f] += count
        # The innermost frame of our own code (or the library that the leaf is in).
        mods = [f for f in frames if "fermix_" in f]
        pkg[mods[-1] if mods else frames[-1].split("(")[1].split("/")[0]
            if "(" in frames[-1] else frames[-1]] += count
    if not total:
        return f"{path.name}: no samples"
    ms = 1000 * cpu_s / turns_n if turns_n else 0.0
    lines = [f"{path.name}: {total} samples (start-up filtered); {ms:.1f} ms CPU per turn "
             f"in this window; shares below are of the samples"]
    lines.append("  top cumulative:")
    for f, c in cum.most_common(top):
        lines.append(f"    {100 * c / total:5.1f}%  {f}")
    lines.append("  top self:")
    for f, c in selfc.most_common(top):
        lines.append(f"    {100 * c / total:5.1f}%  {f}")
    lines.append("  innermost fermix frame (or leaf library) - self+children:")
    for f, c in pkg.most_common(top):
        lines.append(f"    {100 * c / total:5.1f}%  {f}")
    return "\n".join(lines)


def progress(rep: int, m: Row) -> None:
    """Each row's figures as soon as they exist (a long run that dies keeps what it had)."""
    print(f"  run {rep + 1} so far: " + "  ".join(f"{k}={v:.3f}" for k, v in m.items()),
          flush=True)


# --- main ----------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 repeat, small sizes")
    p.add_argument("--rows", default="abcdefg", help="which rows to run, e.g. 'ab'")
    p.add_argument("--rate", type=float, default=500.0, help="row d: gateway-alone req/s")
    p.add_argument("--gateway-processes", type=int, default=1,
                   help="fermix gateway --processes (row d's ack latency under load)")
    p.add_argument("--profile", type=Path, default=None,
                   help="run rows a+b with the gateway and workers under py-spy, to this dir")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--waterfall", action="store_true",
                   help="only the serial turn's latency waterfall (benchmarks/waterfall.py)")
    p.add_argument("--waterfall-turns", type=int, default=100)
    args = p.parse_args()
    if args.waterfall:
        from benchmarks import waterfall

        return waterfall.main(["--turns", str(args.waterfall_turns)])
    sizes = QUICK if args.quick else FULL
    repeat = 1 if args.quick else args.repeat
    rows = "ab" if args.profile and args.rows == "abcdefg" else args.rows
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    targs = argparse.Namespace(workers=2, concurrency=64)
    procs: list[Managed] = []
    with tempfile.TemporaryDirectory(prefix="fermix-perf-") as tmpdir, \
            ScriptedLLMServer() as llm:
        try:
            if args.profile:
                profiled(procs, args.profile)
            url, redis_url = turns.start(targs, Path(tmpdir), llm, procs, extra_env={
                "FERMIX_TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
                "FERMIX_TELEGRAM_BOT_USERNAME": "benchbot",
                "FERMIX_TELEGRAM_API_BASE": "http://127.0.0.1:9",  # never called; no token
                "FERMIX_WORKER_NICE": WORKER_NICE,
                "FERMIX_GATEWAY_PROCESSES": str(args.gateway_processes)})
            r = redis.Redis.from_url(redis_url, decode_responses=True)
            info = machine(redis_url)
            print("machine:")
            for k, v in info.items():
                print(f"  {k:>16}: {v}")
            mode = "QUICK (reduced sizes, 1 repeat)" if args.quick else "full"
            print(f"mode: {mode}; sizes: {sizes}; stack: 2 workers x 64 slots, "
                  f"{args.gateway_processes} gateway process(es); rows {rows}")
            if args.quick:
                print("  reduced vs full:", ", ".join(f"{k} {QUICK[k]} (full {FULL[k]})"
                                                       for k in QUICK if QUICK[k] != FULL[k]))
            # Warm-up: pools and imports, not measured.
            asyncio.run(fire(url, llm, "warm", 8, FAST))
            turns.quiesce(llm, r)
            llm.script.reset()
            results: list[Row] = []
            cmd_per_turn: list[dict[str, float]] = []
            # The floor (benchmarks/floor.py): a trivial Celery task's round trip and tasks/s
            # on this Redis (a database of its own), its workers stopped before the rows.
            floor_url = redis_url.rsplit("/", 1)[0] + "/15"
            floor_procs: list[Managed] = []
            try:
                floor.start(floor_url, Path(tmpdir), floor_procs)
                base = floor.measure(floor_url)
            finally:
                for proc in floor_procs:
                    proc.stop()
            print("floor: " + "  ".join(f"{k}={v:.2f}" for k, v in base.items()), flush=True)
            for rep in range(repeat):
                m: Row = dict(base)
                if "a" in rows:
                    m |= asyncio.run(row_a(url, llm, sizes["a_turns"], rep))
                    turns.quiesce(llm, r)
                    llm.script.reset()
                    progress(rep, m)
                if "b" in rows:
                    n = sizes["b_turns"]
                    before, cpu0 = commandstats(r), turns.cpu_snapshot(procs)
                    m |= asyncio.run(row_b(url, llm, n, rep))
                    after, cpu1 = commandstats(r), turns.cpu_snapshot(procs)
                    m["b_model_calls_per_turn"] = calls = len(llm.script.requests) / n
                    # The reviews the row's turns queued run after it (coalesced per chat,
                    # once it is quiet): a benchmark chat has one turn, so one review each.
                    turns.quiesce(llm, r)
                    cpu2 = turns.cpu_snapshot(procs)
                    reviews = len(llm.script.requests) - calls * n
                    m["b_review_calls_per_turn"] = reviews / n
                    m["b_worker_cpu_ms_per_review"] = 1000 * sum(
                        cpu2[k] - cpu1[k] for k in cpu2 if k.startswith("bench-w")) / max(1, reviews)
                    wk = sum(cpu1[k] - cpu0[k] for k in cpu1 if k.startswith("bench-w"))
                    m["b_worker_cpu_ms_per_turn"] = 1000 * wk / n
                    m["b_gateway_cpu_ms_per_turn"] = 1000 * (cpu1["gateway"] - cpu0["gateway"]) / n
                    m["b_redis_cpu_ms_per_turn"] = 1000 * (cpu1["redis"] - cpu0["redis"]) / n
                    m["b_bench_cpu_ms_per_turn"] = 1000 * (cpu1["bench"] - cpu0["bench"]) / n
                    m["b_redis_cmds_per_turn"] = sum(after.values()) - sum(before.values())
                    m["b_redis_cmds_per_turn"] /= n
                    cmd_per_turn.append({k: (after[k] - before.get(k, 0)) / n for k in after})
                    llm.script.reset()
                    progress(rep, m)
                if "c" in rows:
                    m |= asyncio.run(row_c(url, llm, sizes["c_turns"], rep))
                    turns.quiesce(llm, r)
                    llm.script.reset()
                    progress(rep, m)
                if "d" in rows:
                    gw = next(p.pid for p in procs if p.name == "gateway")
                    m |= asyncio.run(row_d(url, llm, sizes["d_turns"], sizes["d_alone_s"],
                                           args.rate, rep, gw))
                    turns.quiesce(llm, r)
                    llm.script.reset()
                    progress(rep, m)
                if "e" in rows:
                    m |= asyncio.run(row_e(url, llm, rep))
                    turns.quiesce(llm, r)
                    llm.script.reset()
                    progress(rep, m)
                if "f" in rows:
                    m |= row_f(Path(tmpdir), llm, int(sizes["f_turns"]), sizes["f_delay_s"], rep,
                               profile=args.profile)
                    llm.script.reset()
                    progress(rep, m)
                if "g" in rows:  # issue 31's row: 600 turns on a 6 s model in one process
                    m |= row_f(Path(tmpdir), llm, int(sizes["g_turns"]), sizes["g_delay_s"], rep,
                               prefix="g", profile=args.profile)
                    llm.script.reset()
                    progress(rep, m)
                if "a_client_p50_ms" in m:
                    m["a_x_floor"] = m["a_client_p50_ms"] / base["floor_rtt_p50_ms"]
                if "b_turns_per_s" in m:
                    m["b_x_floor"] = m["b_turns_per_s"] / base["floor_tasks_per_s"]
                results.append(m)
                print(f"run {rep + 1} done: " + "  ".join(f"{k}={v:.3f}" for k, v in m.items()),
                      flush=True)
            print(f"summary: median (min-max) over {len(results)} repeat(s)")
            for k in results[0]:
                vals = [x[k] for x in results if k in x]
                print(f"  {k:>28}: {statistics.median(vals):10.3f}  "
                      f"({min(vals):.3f}-{max(vals):.3f})")
            if cmd_per_turn:
                print("redis commands per turn (row b, incl. the gateway's wait polls and idle "
                      "polling; median over repeats):")
                names = {k for x in cmd_per_turn for k in x}
                med = {k: statistics.median([x.get(k, 0.0) for x in cmd_per_turn]) for k in names}
                for k, v in sorted(med.items(), key=lambda kv: -kv[1]):
                    if v >= 0.05:
                        print(f"  {k:>20}: {v:7.2f}")
            ok = all(v == 1.0 for x in results for k, v in x.items() if k.endswith("_ok"))
            r.close()
            if args.profile:
                stop_profilers(procs)
                n = sizes["a_turns"] + sizes["b_turns"] + 8
                for f in sorted(args.profile.glob("*.txt")):
                    print(summarize(f, args.top, n, 0.0))
            return 0 if ok else 1
        finally:
            for proc in reversed(procs):
                proc.stop()


if __name__ == "__main__":
    sys.exit(main())
