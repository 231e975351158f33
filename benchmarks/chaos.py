"""Chaos run: numbered messages through a real Fermix stack while its parts are killed, then an
audit of what happened to every message the gateway accepted.

Starts a private redis-server (AOF ``appendonly yes``, ``appendfsync everysec``, as deploy/
requires), an in-process scripted OpenAI-compatible model, the gateway and W ``celery worker``
processes. A client sends N messages over C chats at a steady rate ("chat-17 #42": strictly
numbered per chat; a chat's next message only after its previous one was accepted), with
bounded concurrency, and retries a POST that failed (connection error, timeout, 5xx; a 429
after its ``Retry-After``) with the same ``messageId``, so a retry is de-duplicated by the
gateway, never doubled; ``--replay`` (2 %) of the accepted messages are POSTed again on purpose
and must come back as duplicates of the same run. Meanwhile it
SIGKILLs a random worker ``--kills`` times (a fresh one takes its place after 1 s), SIGKILLs
Redis once (restarted on the same port and data directory after 2 s: the AOF brings it back) and
SIGKILLs the gateway once (restarted at once). The model answers "answer to chat-17 #42" after
0.2-0.5 s, so turns are in flight when the faults land.

After a settle period it prints accepted, answered, errored, lost, duplicated, order
violations, crossed replies, stuck conversations and the time from each worker kill to the
resumption of the turns it held (see ``chaos_audit``). Exit code 0 when lost, duplicated,
order violations, crossed and stuck are all 0, else 1 (130 when interrupted). The whole run
ends within ``--duration`` seconds (a watchdog kills everything 60 s past it and exits 3) and
always stops its processes.

    .venv/bin/python benchmarks/chaos.py                          # 10,000 messages, 500 chats
    .venv/bin/python benchmarks/chaos.py --messages 600 --chats 60 --kills 2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chaos_audit import (  # noqa: E402
    TEXT_RE,
    Accepted,
    FaultKind,
    FaultRecord,
    MessageRef,
    ModelCall,
    Summary,
    answer_of,
    audit,
    busy_chats,
    chat_id,
    parse_model_call,
    ref,
    text_of,
    unfinished,
)
from fermix_dev.procs import Managed, free_port, start_redis, wait_until  # noqa: E402
from fermix_dev.scripted_llm import Reply, Script, ScriptedLLMServer  # noqa: E402
from fermix_dev.scripted_llm.script import Disconnect, Fail, Hang  # noqa: E402
from fermix_shared import keys  # noqa: E402

REVIEW_REPLY = '{"add": [], "replace": [], "archive": []}'
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ChaosConfig:
    messages: int = 10_000
    chats: int = 500
    workers: int = 3
    kills: int = 4
    redis_restarts: int = 1
    gateway_restarts: int = 1
    rate: float = 25.0  # messages per second, all chats together
    http_pool: int = 32  # POSTs in flight at most
    replay: float = 0.02  # share of accepted messages POSTed once more at once, same messageId
    concurrency: int = 100  # turns per worker process
    delay_min: float = 0.2  # the scripted model's answer time, s
    delay_max: float = 0.5
    redis_down_s: float = 2.0
    worker_down_s: float = 1.0
    settle_s: float = 120.0  # after the last message, for the fleet to finish
    duration_s: float = 900.0  # the whole run, start-up and audit included
    seed: int = 1
    logs: Path | None = None  # process logs and Redis data; a temporary directory if unset


class ChaosModel(Script):
    """The scripted model: "chat-17 #42" is answered "answer to chat-17 #42" after a random
    0.2-0.5 s (half before the first byte, half over the stream); anything else (the memory
    review) gets an empty review plan at once. Keeps a compact log of the turn requests."""

    def __init__(self, seed: int, delay: tuple[float, float]):
        super().__init__()
        self._rng, self._delay = random.Random(seed), delay
        self._log_lock = threading.Lock()
        self.calls: list[ModelCall] = []

    def next_for(self, request_text: str) -> Reply | Fail | Hang | Disconnect | None:
        asked = ref(TEXT_RE, request_text)
        if asked is None:
            return Reply(text=REVIEW_REPLY)
        delay = self._rng.uniform(*self._delay)
        return Reply(text=answer_of(*asked), delay=delay / 2, chunk_delay=delay / 2 / 7)

    def record(self, request: dict[str, Any]) -> None:
        call = parse_model_call(request.get("body"), time.time())
        if call is not None:
            with self._log_lock:
                self.calls.append(call)


class ChaosStack:
    """Redis, the gateway and the workers of a chaos run, and the faults done to them."""

    def __init__(self, cfg: ChaosConfig, logs: Path, model_url: str):
        self.cfg, self.logs = cfg, logs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("FERMIX_", "OPENAI_", "ANTHROPIC_"))}
        self.env.update(FERMIX_HOME=str(logs / "home"), PYTHONUNBUFFERED="1",
                        FERMIX_PROVIDER="openai", FERMIX_MODEL="chaos",
                        OPENAI_BASE_URL=model_url, OPENAI_API_KEY="chaos-key")
        self.redis_url = ""
        self.redis_port = 0
        self.workers: list[Managed] = []
        self._procs: list[Managed] = []  # every process ever started, for cleanup
        self._incarnations = [0] * cfg.workers

    # -- start and stop ----------------------------------------------------------------------

    def start(self) -> None:
        # A kept --logs directory may hold an earlier run's AOF: start from an empty Redis.
        shutil.rmtree(self.logs / "redis-data", ignore_errors=True)
        proc, self.redis_url = start_redis(self.logs / "redis-data", log_path=self.logs / "redis.log")
        self._procs.append(proc)
        self.redis_port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])
        self.env["FERMIX_REDIS_URL"] = self.redis_url
        gateway = self._spawn_gateway()
        self.workers = [self._spawn_worker(i) for i in range(self.cfg.workers)]
        for w in self.workers:
            self._wait_beating(w, 120)
        wait_until(self._healthy, 60, "gateway", gateway.proc)

    def stop(self) -> None:
        """SIGTERM the gateway and workers together, SIGKILL what is left after 10 s, then
        stop Redis (last, so nothing shuts down while reconnecting to it)."""
        apps = [p for p in self._procs if p.name != "redis" and p.proc.poll() is None]
        for p in apps:
            p.kill(signal.SIGTERM)
        until = time.monotonic() + 10
        for p in apps:
            try:
                p.proc.wait(max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(5)
        for p in self._procs:
            if p.name == "redis":
                with contextlib.suppress(Exception):
                    p.stop()

    def kill_all(self) -> None:
        """SIGKILL every process group at once (the watchdog's last resort)."""
        for p in list(self._procs):
            p.kill(signal.SIGKILL)

    def _managed(self, name: str, argv: list[str]) -> Managed:
        proc = Managed(name, argv, env=self.env, log_path=self.logs / f"{name}.log")
        self._procs.append(proc)
        return proc

    def _spawn_gateway(self) -> Managed:
        return self._managed("gateway", [sys.executable, "-m", "fermix_cli", "gateway",
                                         "--port", str(self.port)])

    def _spawn_worker(self, slot: int) -> Managed:
        """A new worker process in ``slot``; a restarted one gets a new node name."""
        k = self._incarnations[slot]
        self._incarnations[slot] += 1
        name = f"chaos-w{slot + 1}" + (f"r{k}" if k else "")
        return self._managed(name, [sys.executable, "-m", "fermix_cli", "worker", "--concurrency",
                                    str(self.cfg.concurrency), "--name", f"{name}@%h"])

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=10,
                                    socket_connect_timeout=2)

    def _beating(self, w: Managed) -> bool:
        with self.redis() as r:
            beats: dict[str, str] = r.hgetall(keys.workers())
        return any(k.startswith(f"{w.name}@") and float(v) >= w.started_at
                   for k, v in beats.items())

    def _wait_beating(self, w: Managed, timeout: float) -> None:
        wait_until(lambda: self._beating(w), timeout, f"worker {w.name}", w.proc)

    def _healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

    # -- faults ------------------------------------------------------------------------------

    def held_by(self, name: str) -> dict[str, str]:
        """run id -> conversation of every active turn the worker named ``name`` holds."""
        with self.redis() as r:
            convs: list[str] = r.zrange(keys.active_index(), 0, -1)
            pipe = r.pipeline(transaction=False)
            for conv in convs:
                pipe.hmget(keys.active(conv), "turn_id", "worker")
            rows = pipe.execute()
        return {turn: conv for conv, (turn, worker) in zip(convs, rows, strict=True)
                if turn and worker and worker.startswith(f"{name}@")}

    def kill_worker(self, slot: int, at_s: float) -> FaultRecord:
        w = self.workers[slot]
        try:
            held = self.held_by(w.name)
        except redis.RedisError:
            held = {}
        w.kill(signal.SIGKILL)
        w.proc.wait(10)
        f = FaultRecord("kill-worker", at_s, w.name, held=held, killed_at=time.time())
        time.sleep(self.cfg.worker_down_s)
        fresh = self.workers[slot] = self._spawn_worker(slot)
        with contextlib.suppress(TimeoutError, RuntimeError):
            self._wait_beating(fresh, 90)
            f.down_s = round(time.time() - f.killed_at, 2)
        return f

    def restart_redis(self, at_s: float) -> FaultRecord:
        old = next(p for p in reversed(self._procs) if p.name == "redis")
        old.kill(signal.SIGKILL)
        old.proc.wait(10)
        f = FaultRecord("restart-redis", at_s, "redis", killed_at=time.time())
        time.sleep(self.cfg.redis_down_s)
        proc, _ = start_redis(self.logs / "redis-data", self.redis_port,
                              log_path=self.logs / "redis.log")
        self._procs.append(proc)
        f.down_s = round(time.time() - f.killed_at, 2)
        return f

    def restart_gateway(self, at_s: float) -> FaultRecord:
        old = next(p for p in reversed(self._procs) if p.name == "gateway")
        old.kill(signal.SIGKILL)
        old.proc.wait(10)
        f = FaultRecord("restart-gateway", at_s, "gateway", killed_at=time.time())
        fresh = self._spawn_gateway()
        wait_until(self._healthy, 60, "gateway", fresh.proc)
        f.down_s = round(time.time() - f.killed_at, 2)
        return f


def plan_faults(cfg: ChaosConfig, span_s: float, rng: random.Random) -> list[tuple[float, FaultKind]]:
    """When each fault lands (seconds after the first message), spread over the send window:
    kills over 8-88 % of it, the Redis restart over 30-60 %, the gateway's over 55-85 %."""
    def spaced(n: int, lo: float, hi: float) -> list[float]:
        return [span_s * (lo + (hi - lo) * (k + rng.random()) / n) for k in range(n)]

    plan: list[tuple[float, FaultKind]] = [(t, "kill-worker") for t in spaced(cfg.kills, 0.08, 0.88)]
    plan += [(t, "restart-redis") for t in spaced(cfg.redis_restarts, 0.3, 0.6)]
    plan += [(t, "restart-gateway") for t in spaced(cfg.gateway_restarts, 0.55, 0.85)]
    return sorted(plan)


# -- the client ------------------------------------------------------------------------------

@dataclass
class Traffic:
    accepted: list[Accepted] = field(default_factory=list)
    unconfirmed: list[MessageRef] = field(default_factory=list)  # gave up after errors
    refused: int = 0  # answered 4xx (not 429)
    sent: int = 0
    retries_connection: int = 0
    retries_5xx: int = 0
    throttled: int = 0
    deduplicated: int = 0  # a retried POST answered as a duplicate: its first try got through
    replayed: int = 0
    replays_doubled: list[MessageRef] = field(default_factory=list)  # a replay made a new run


async def post_message(client: httpx.AsyncClient, pool: asyncio.Semaphore, chat: int, n: int,
                       stop_at: float, t: Traffic, replay: bool = False) -> None:
    """POST one message until it is accepted or refused; a failed attempt is retried with the
    same ``messageId`` (so the gateway answers it as a duplicate if the first got through).
    ``replay``: once accepted, POST it again at once, as a client that lost the answer would."""
    body = {"message": text_of(chat, n), "chatId": chat_id(chat), "messageId": f"{chat}-{n}"}
    backoff = 0.2
    while True:
        async with pool:
            try:
                resp = await client.post("/v1/agent", json=body)
            except httpx.TransportError:
                resp = None
        wait = backoff
        if resp is None:
            t.retries_connection += 1
        elif resp.status_code == 202:
            data = resp.json()
            t.accepted.append(Accepted(chat, n, str(data["runId"])))
            t.deduplicated += bool(data.get("duplicate"))
            if replay:
                await replay_message(client, pool, body, str(data["runId"]), (chat, n), t)
            return
        elif resp.status_code == 429:
            t.throttled += 1
            with contextlib.suppress(ValueError):
                wait = max(wait, float(resp.headers.get("retry-after", "0")))
        elif resp.status_code >= 500:
            t.retries_5xx += 1
        else:
            t.refused += 1
            return
        if time.monotonic() + wait >= stop_at:
            t.unconfirmed.append((chat, n))
            return
        await asyncio.sleep(wait)
        backoff = min(2.0, backoff * 2)


async def replay_message(client: httpx.AsyncClient, pool: asyncio.Semaphore,
                         body: dict[str, str], run_id: str, msg: MessageRef, t: Traffic) -> None:
    """The accepted message again: it must come back as a duplicate of the same run."""
    for _ in range(3):
        async with pool:
            try:
                resp = await client.post("/v1/agent", json=body)
            except httpx.TransportError:
                continue
        if resp.status_code == 202:
            t.replayed += 1
            data = resp.json()
            if not data.get("duplicate") or data.get("runId") != run_id:
                t.replays_doubled.append(msg)
            return
        await asyncio.sleep(0.5)


async def send_chat(client: httpx.AsyncClient, pool: asyncio.Semaphore, cfg: ChaosConfig,
                    chat: int, t0: float, stop_at: float, t: Traffic) -> None:
    """The chat's messages in order, each at its slot of the global steady rate (message i of
    all, round-robin over the chats, at i / rate) and never before the previous one ended."""
    count = cfg.messages // cfg.chats + (chat < cfg.messages % cfg.chats)
    replays = random.Random(f"{cfg.seed}-{chat}")
    for n in range(1, count + 1):
        slot = t0 + ((n - 1) * cfg.chats + chat) / cfg.rate
        await asyncio.sleep(max(0.0, slot - time.monotonic()))
        if time.monotonic() >= stop_at:
            return
        t.sent += 1
        await post_message(client, pool, chat, n, stop_at, t, replays.random() < cfg.replay)


async def inflict(stack: ChaosStack, plan: list[tuple[float, FaultKind]], rng: random.Random,
                  t0: float, stop_at: float, out: list[FaultRecord], progress: Progress) -> None:
    for at, kind in plan:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        if time.monotonic() >= stop_at:
            return
        at_s = round(time.monotonic() - t0, 1)
        if kind == "kill-worker":
            f = await asyncio.to_thread(stack.kill_worker, rng.randrange(stack.cfg.workers), at_s)
        elif kind == "restart-redis":
            f = await asyncio.to_thread(stack.restart_redis, at_s)
        else:
            f = await asyncio.to_thread(stack.restart_gateway, at_s)
        out.append(f)
        held = f" holding {len(f.held)} turns" if kind == "kill-worker" else ""
        progress(f"{at_s:7.1f} s  {kind} {f.target}{held}: back in {f.down_s} s")


async def report_progress(t: Traffic, t0: float, total: int, progress: Progress) -> None:
    while True:
        await asyncio.sleep(15)
        progress(f"{time.monotonic() - t0:7.1f} s  sent {t.sent}/{total}, accepted "
                 f"{len(t.accepted)}, retried {t.retries_connection} + {t.retries_5xx}")


async def drive(stack: ChaosStack, plan: list[tuple[float, FaultKind]], rng: random.Random,
                stop_at: float, faults: list[FaultRecord], progress: Progress) -> Traffic:
    cfg, t = stack.cfg, Traffic()
    limits = httpx.Limits(max_connections=cfg.http_pool, max_keepalive_connections=cfg.http_pool)
    timeout = httpx.Timeout(15.0, connect=3.0, pool=None)
    pool = asyncio.Semaphore(cfg.http_pool)
    async with httpx.AsyncClient(base_url=stack.url, limits=limits, timeout=timeout) as client:
        t0 = time.monotonic()
        ticker = asyncio.create_task(report_progress(t, t0, cfg.messages, progress))
        try:
            await asyncio.gather(
                inflict(stack, plan, rng, t0, stop_at, faults, progress),
                *(send_chat(client, pool, cfg, c, t0, stop_at, t) for c in range(cfg.chats)),
            )
        finally:
            ticker.cancel()
    return t


def settle(stack: ChaosStack, run_ids: list[str], until: float) -> None:
    """Until every accepted run has ended and no conversation is busy, or ``until``."""
    pending = set(run_ids)
    with stack.redis() as r:
        while time.monotonic() < until:
            with contextlib.suppress(redis.RedisError):
                pending = unfinished(r, pending)
                if not pending and busy_chats(r, stack.cfg.chats) == 0:
                    return
            time.sleep(1.0)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(cfg: ChaosConfig, progress: Progress = _stderr,
        on_start: Callable[[ChaosStack], None] | None = None) -> Summary:
    """One chaos run (see the module docstring); every process it starts is stopped."""
    began = time.monotonic()
    deadline = began + cfg.duration_s
    rng = random.Random(cfg.seed)
    with contextlib.ExitStack() as cleanup:
        logs = cfg.logs or Path(cleanup.enter_context(
            tempfile.TemporaryDirectory(prefix="fermix-chaos-")))
        logs.mkdir(parents=True, exist_ok=True)
        model = ChaosModel(cfg.seed + 1, (cfg.delay_min, cfg.delay_max))
        llm = cleanup.enter_context(ScriptedLLMServer(script=model))
        stack = ChaosStack(cfg, logs, llm.openai_base_url)
        cleanup.callback(stack.stop)
        if on_start is not None:
            on_start(stack)
        stack.start()
        started = time.monotonic()
        # Sending stops in time for the settle period and the audit to fit the duration.
        stop_at = deadline - cfg.settle_s - 20
        span = min(cfg.messages / cfg.rate, stop_at - started)
        plan = plan_faults(cfg, span, rng)
        progress(f"stack up in {started - began:.0f} s ({cfg.workers} workers, logs in {logs}); "
                 f"sending {cfg.messages} messages over {cfg.chats} chats at {cfg.rate}/s "
                 f"(~{cfg.messages / cfg.rate:.0f} s), {len(plan)} faults")
        faults: list[FaultRecord] = []
        traffic = asyncio.run(drive(stack, plan, rng, stop_at, faults, progress))
        sent_at = time.monotonic()
        progress(f"sent: {len(traffic.accepted)} accepted; settling (up to {cfg.settle_s:.0f} s)")
        settle(stack, [a.run_id for a in traffic.accepted], min(sent_at + cfg.settle_s,
                                                                 deadline - 15))
        settled_at = time.monotonic()
        with stack.redis() as r:
            summary = audit(r, cfg.chats, traffic.accepted, traffic.unconfirmed,
                            list(model.calls), faults, doubled=traffic.replays_doubled)
    summary.planned = cfg.messages
    summary.not_accepted = traffic.refused + len(traffic.unconfirmed) + (cfg.messages - traffic.sent)
    summary.cut_short = traffic.sent < cfg.messages
    summary.post_retries_connection = traffic.retries_connection
    summary.post_retries_5xx = traffic.retries_5xx
    summary.post_throttled = traffic.throttled
    summary.post_deduplicated = traffic.deduplicated
    summary.replayed = traffic.replayed
    summary.send_s = round(sent_at - started, 1)
    summary.settle_s = round(settled_at - sent_at, 1)
    summary.total_s = round(time.monotonic() - began, 1)
    summary.config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    return summary


# -- the command -----------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> tuple[ChaosConfig, bool]:
    """The run's configuration, and whether to print JSON."""
    d = ChaosConfig()
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--messages", type=int, default=d.messages)
    p.add_argument("--chats", type=int, default=d.chats)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--kills", type=int, default=d.kills, help="worker SIGKILLs")
    p.add_argument("--redis-restarts", type=int, default=d.redis_restarts)
    p.add_argument("--gateway-restarts", type=int, default=d.gateway_restarts)
    p.add_argument("--rate", type=float, default=d.rate, help="messages per second")
    p.add_argument("--http-pool", type=int, default=d.http_pool, help="POSTs in flight at most")
    p.add_argument("--replay", type=float, default=d.replay,
                   help="share of accepted messages POSTed again (same messageId)")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="turns per worker")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--settle", type=float, default=d.settle_s, help="s after the last message")
    p.add_argument("--duration", type=float, default=d.duration_s,
                   help="hard cap on the whole run, s (sending is cut to fit)")
    p.add_argument("--logs", type=Path, default=None, help="keep logs and Redis data here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    if not (0 < a.chats <= a.messages <= 100_000 and 0 < a.workers <= 16 and 0 <= a.kills <= 100
            and 0 <= a.redis_restarts <= 10 and 0 <= a.gateway_restarts <= 10
            and 0 < a.rate <= 1000 and 0 < a.http_pool <= 1000 and 0 < a.concurrency <= 2000
            and 0 <= a.replay <= 1            and 0 <= a.settle < a.duration <= 24 * 3600):
        p.error("out of bounds: 0 < chats <= messages <= 100000, workers <= 16, kills <= 100, "
                "rate <= 1000, settle < duration")
    return ChaosConfig(messages=a.messages, chats=a.chats, workers=a.workers, kills=a.kills,
                       redis_restarts=a.redis_restarts, gateway_restarts=a.gateway_restarts,
                       rate=a.rate, http_pool=a.http_pool, replay=a.replay,
                       concurrency=a.concurrency,
                       seed=a.seed, settle_s=a.settle, duration_s=a.duration, logs=a.logs), a.json


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse_args(argv)
    stacks: list[ChaosStack] = []

    def hard_stop() -> None:
        _stderr(f"chaos: hard timeout ({cfg.duration_s:.0f} s + 60 s): killing everything")
        for s in stacks:
            s.kill_all()
        os._exit(3)

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    watchdog = threading.Timer(cfg.duration_s + 60, hard_stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        summary = run(cfg, on_start=stacks.append)
    except KeyboardInterrupt:
        _stderr("chaos: interrupted; every process it started is stopped")
        return 130
    finally:
        watchdog.cancel()
    print(json.dumps(summary.to_json(), indent=2) if as_json else summary.render(), flush=True)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
