"""The standard Sentinel set-up, one primary, one replica and three sentinels, loses its primary
under load (issue 25 item 4).

A gateway and a worker know Redis only through the sentinels, with
``FERMIX_REDIS_WAIT_REPLICAS`` unset (``auto``). Three chats post continuously, each retrying a
refusal with the same ``messageId`` as a platform retries a webhook. The primary is SIGKILLed;
its only replica is promoted and has no replica of its own, so a ``WAIT 1`` can never be met
again: under ``auto`` the gateway accepts without one.

What a user would notice: messages are accepted again within 5 s of the kill; every message
the gateway acknowledged is answered, none twice; the processes carry on without a restart.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import (
    all_sent,
    answer,
    finished_runs,
    posting_chats,
    repeated_replies,
    terminal_events,
    wait_acked,
)
from tests.sentinels import SentinelSet

CHATS = 3
PERIOD_S = 0.2  # each chat posts this often: 15 messages a second in all


@pytest.fixture
def stack(sset: SentinelSet, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), **sset.env(db=0)}
    s = start_stack("failover1", f"redis://127.0.0.1:{sset.primary_port}/0", 0, env, logs_dir)
    yield s
    s.stop()


def test_one_replica_set_accepts_again_within_5_s_of_losing_its_primary(
    sset: SentinelSet, stack: Stack
) -> None:
    pids = [p.pid for p in stack.procs]
    with posting_chats(stack.url, "fo1", CHATS, PERIOD_S) as chats:
        wait_acked(chats, 2 * CHATS, 15)
        killed_at = time.time()
        old = sset.kill_primary()
        sset.wait_promoted(old)
        deadline = time.monotonic() + 10
        # Load goes on until a message first sent after the kill is acknowledged, then 1 s more.
        while not any(m.acked and m.first_try > killed_at for m in all_sent(chats)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(1.0)
    sent = all_sent(chats)
    acked = [m for m in sent if m.acked]
    after_kill = sorted(m.acked for m in acked if m.acked and m.acked > killed_at)
    assert after_kill, "no message accepted after the kill"
    first_ack = after_kill[0] - killed_at
    errors = [e for m in sent for e in m.errors]
    print(f"\nfailover, 1 replica, auto: first message accepted {first_ack:.2f} s after the "
          f"kill; {len(errors)} refused attempts; {len(acked)} acknowledged, "
          f"{len(after_kill)} after the kill")
    assert first_ack < 5, f"accepted again only {first_ack:.2f} s after the kill"

    r = sset.client()
    with stack.http() as http:
        runs = finished_runs(http, acked, 30)
        # None lost: every acknowledged message has its own answer.
        lost = [(m.text, runs[m.message_id]["status"]) for m in acked
                if runs[m.message_id]["status"] != "ok"
                or answer(runs[m.message_id]["reply"] or "") != m.text]
        assert lost == []
        # None answered twice.
        twice = [m.text for m in acked if len(terminal_events(r, str(m.run_id))) != 1]
        twice += repeated_replies(r, [c.chat for c in chats])
        assert twice == []
        # The same processes, still serving; the gateway says it accepts unreplicated.
        assert [p.pid for p in stack.procs] == pids
        assert all(p.proc.poll() is None for p in stack.procs)
        health = http.get("/healthz").json()
        metrics = http.get("/metrics").text
    r.close()
    assert health["detail"]["redis.replicas"]["connected"] == 0
    found = re.search(r"^fermix_unreplicated_accepts_total (\S+)$", metrics, re.M)
    assert found and float(found.group(1)) >= len(after_kill)
