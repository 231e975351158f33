"""Randomized stress: many chats, many messages, random provider delays, three workers, one of
them SIGKILLed mid-run and restarted. Every message gets exactly one outcome (its turns resume
on another worker), every chat's order holds, history holds each answer once. Seeded: FERMIX_STRESS_SEED=N reproduces a run (the seed is printed on failure)."""

from __future__ import annotations

import os
import random
import signal
from collections import defaultdict
from pathlib import Path

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_worker.turn import GENERIC_ERROR
from tests.conftest import provider_env, start_stack
from tests.fleet import first_event, start, terminal_events, uniq, wait

CHATS, PER_CHAT = 10, 6


def test_every_message_gets_one_outcome_in_order_through_a_worker_crash(
    redis_url: str, llm: ScriptedLLMServer, logs_dir: Path
) -> None:
    seed = int(os.environ.get("FERMIX_STRESS_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    env = {**provider_env(llm, "openai"), "FERMIX_LEASE_SECONDS": "3",
           "FERMIX_CANCEL_POLL_SECONDS": "0.2"}
    stack = start_stack("stress", redis_url, 6, env, logs_dir, workers=3)
    try:
        chats = [uniq("chat") for _ in range(CHATS)]
        plan = [(c, uniq(f"s{i}")) for c in chats for i in range(PER_CHAT)]
        # Random interleaving across chats, keeping each chat's own order.
        order: list[tuple[str, str]] = []
        pending = {c: [t for cc, t in plan if cc == c] for c in chats}
        while any(pending.values()):
            c = rng.choice([c for c, ts in pending.items() if ts])
            order.append((c, pending[c].pop(0)))
        for _, t in order:
            # A second entry answers the call again if its worker dies and the turn resumes.
            delay = rng.uniform(0.0, 0.4)
            llm.script.push(Reply(text=f"re:{t}", delay=delay, match=t),
                            Reply(text=f"re:{t}", delay=delay, match=t))

        runs: dict[str, str] = {}
        with stack.http() as http:
            half = len(order) // 2
            for c, t in order[:half]:
                runs[t] = start(http, t, c)
            # Kill the worker running some turn, mid-turn, while messages keep arriving.
            probe = runs[order[half - 1][1]]
            first_event(http, probe, "lifecycle", timeout=60)
            holder = http.get(f"/v1/runs/{probe}").json().get("worker", "")
            victim = next((w for w in stack.workers if holder.startswith(w.name + "@")),
                          stack.workers[0])
            os.killpg(victim.pid, signal.SIGKILL)
            victim.proc.wait()
            for c, t in order[half:]:
                runs[t] = start(http, t, c)
            stack.workers.remove(victim)
            stack.procs.remove(victim)
            stack.start_worker(victim.name)
            results = {t: wait(http, rid, timeout=60) for t, rid in runs.items()}

        r = stack.redis()
        by_chat: dict[str, list[dict]] = defaultdict(list)
        errors = 0
        for c, t in order:
            res = results[t]
            assert len(terminal_events(r, runs[t])) == 1, f"seed={seed}: {t} ended twice"
            if res["status"] == "ok":
                assert res["reply"] == f"re:{t}", f"seed={seed}"
            else:
                assert (res["status"], res["error"]) == ("error", GENERIC_ERROR), f"seed={seed}: {res}"
                errors += 1
            by_chat[c].append(res)
        # Turns cut short by the crash resume from their checkpoints: nothing is lost.
        assert errors == 0, f"seed={seed}: {errors} turns failed"
        for c, rs in by_chat.items():
            hist = [ChatMessage.model_validate_json(x)
                    for x in r.lrange(keys.history(f"http|{c}|root"), 0, -1)]  # type: ignore[union-attr]
            sent = [t for cc, t in order if cc == c]
            assert [m.content for m in hist if m.role == "user"] == sent, f"seed={seed}: order"
            assert [m.content for m in hist if m.role == "assistant"] == [f"re:{t}" for t in sent], (
                f"seed={seed}: every message answered exactly once, in order")
            for before, after in zip(rs, rs[1:], strict=False):
                assert after["startedAt"] >= before["endedAt"], f"seed={seed}: chat {c} overlapped"
    finally:
        stack.stop()
