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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import answer, terminal_events, uniq
from tests.sentinels import SentinelSet

CHATS = 3
PERIOD_S = 0.2  # each chat posts this often: 15 messages a second in all
RETRY_S = 0.1  # a refusal is retried after this


@dataclass
class Sent:
    text: str
    message_id: str
    first_try: float  # time.time()
    acked: float | None = None
    run_id: str | None = None
    errors: list[tuple[float, int]] = field(default_factory=list)  # (when, status; 0 = none)


class Chat(threading.Thread):
    """Posts to one chat every PERIOD_S until stopped, each message until it is acknowledged."""

    def __init__(self, base_url: str, chat: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.base_url, self.chat, self.stop = base_url, chat, stop
        self.sent: list[Sent] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                msg = Sent(f"{self.chat} message {n}", uniq("mid"), time.time())
                self.sent.append(msg)
                while msg.acked is None and not self.stop.is_set():
                    try:
                        resp = http.post("/v1/agent", json={
                            "message": msg.text, "chatId": self.chat, "messageId": msg.message_id})
                        status = resp.status_code
                    except httpx.HTTPError:
                        status = 0
                    if 200 <= status < 300:
                        msg.acked, msg.run_id = time.time(), resp.json()["runId"]
                    else:
                        msg.errors.append((time.time(), status))
                        self.stop.wait(RETRY_S)
                self.stop.wait(PERIOD_S)


@pytest.fixture
def sset(tmp_path: Path, logs_dir: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path, logs_dir, replicas=1)
    yield s
    s.stop()


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
    stop = threading.Event()
    chats = [Chat(stack.url, uniq("fo1"), stop) for _ in range(CHATS)]
    for c in chats:
        c.start()
    try:
        deadline = time.monotonic() + 15
        while sum(1 for c in chats for m in c.sent if m.acked) < 2 * CHATS:
            assert time.monotonic() < deadline, "no steady load before the kill"
            time.sleep(0.05)
        killed_at = time.time()
        old = sset.kill_primary()
        sset.wait_promoted(old)
        deadline = time.monotonic() + 10
        # Load goes on until a message first sent after the kill is acknowledged, then 1 s more.
        while not any(m.acked and m.first_try > killed_at for c in chats for m in c.sent):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(1.0)
    finally:
        stop.set()
        for c in chats:
            c.join(10)
    sent = [m for c in chats for m in c.sent]
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
        runs = {}
        for m in acked:
            done = http.get(f"/v1/runs/{m.run_id}/wait", params={"timeout": 30}, timeout=40)
            assert done.status_code == 200, done.text
            runs[m.message_id] = http.get(f"/v1/runs/{m.run_id}").json()
        # None lost: every acknowledged message has its own answer.
        lost = [(m.text, runs[m.message_id]["status"]) for m in acked
                if runs[m.message_id]["status"] != "ok"
                or answer(runs[m.message_id]["reply"] or "") != m.text]
        assert lost == []
        # None answered twice.
        twice = [m.text for m in acked if len(terminal_events(r, str(m.run_id))) != 1]
        for c in chats:
            history = [ChatMessage.model_validate_json(x) for x in
                       r.lrange(keys.history(f"http|{c.chat}|root"), 0, -1)]
            replies = [h.content for h in history if h.role == "assistant"]
            twice += [t for t in set(replies) if replies.count(t) > 1]
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
