"""The Redis primary dies under load and Sentinel promotes a replica (issue 19 item 2).

A gateway and two workers know Redis only through three sentinels (``FERMIX_REDIS_SENTINELS``,
``FERMIX_REDIS_MASTER``; the URL's host names nothing that runs). Six chats post at a steady
rate, each retrying a 503 with the same ``messageId`` as a platform retries a webhook. The
primary is SIGKILLed mid-load; one of its two replicas is promoted (two, so the new master
still has one replica and the gateway's WAIT 1 can be met).

A beat, also configured only through the sentinels, fires an every-second job throughout.

What a user would notice: every message the gateway acknowledged with 2xx is answered, none
twice; the job keeps firing, each occurrence once; the processes carry on without a restart.
Measured (printed, and in the README's "Redis Sentinel"): kill to promotion, to the first
accepted message, to the first finished turn, to the first scheduled run, and the 503s seen
in between.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from fermix_dev.procs import Managed, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import terminal_events, uniq
from tests.sentinels import SentinelSet

CHATS = 6
PERIOD_S = 0.25  # each chat posts this often: 24 messages a second in all
RETRY_S = 0.1  # a 503 is retried after this (a platform honours Retry-After: 1 s)


@dataclass
class Sent:
    chat: str
    text: str
    message_id: str
    first_try: float  # time.time()
    acked: float | None = None
    run_id: str | None = None
    errors: list[tuple[float, int]] = field(default_factory=list)  # (when, status; 0 = no answer)


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
                msg = Sent(self.chat, f"{self.chat} message {n}", uniq("mid"), time.time())
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


@pytest.fixture(scope="module")
def sset(tmp_path_factory: pytest.TempPathFactory, logs_dir: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path_factory.mktemp("failover"), logs_dir, replicas=2)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def stack(sset: SentinelSet, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), **sset.env(db=0)}
    s = start_stack("failover", f"redis://127.0.0.1:{sset.primary_port}/0", 0, env, logs_dir,
                    workers=2)
    beat = Managed("failover-beat", [sys.executable, "-m", "fermix_cli", "beat"], env=s.env,
                   log_path=logs_dir / "failover-beat.log")
    s.procs.append(beat)
    r = sset.client()
    try:
        wait_until(lambda: r.exists("redbeat::lock") == 1, 30, "beat holding its lock", beat.proc)
    except Exception:
        s.stop()
        raise
    finally:
        r.close()
    yield s
    s.stop()


def _answer(text: str) -> str:
    return f'Scripted reply: you said "{text}"'


def test_a_primary_killed_under_load_loses_no_acknowledged_message(
    sset: SentinelSet, stack: Stack, llm: ScriptedLLMServer
) -> None:
    pids = [p.pid for p in stack.procs]
    job = uniq("every-second")
    r = sset.client()
    JobStore(r).add(new_job(name=job, message=f"{job} tick", schedule=make_schedule(every_s=1),
                            delivery=parse_delivery(None, None), trust="operator",
                            created_by="test"))
    wait_until(lambda: len(JobStore(r).runs(job)) >= 2, 15, "the job firing before the kill")
    stop = threading.Event()
    chats = [Chat(stack.url, uniq("fo"), stop) for _ in range(CHATS)]
    for c in chats:
        c.start()
    try:
        with stack.http() as http:  # load runs and turns finish before the kill
            deadline = time.monotonic() + 15
            while sum(1 for c in chats for m in c.sent if m.acked) < 3 * CHATS:
                assert time.monotonic() < deadline, "no steady load before the kill"
                time.sleep(0.05)
            # A turn streaming its answer for ~3 s across the kill: it pauses, then finishes.
            slow_text = uniq("streaming-across")
            slow_answer = " ".join(f"word{i}" for i in range(10))
            llm.script.push(Reply(text=slow_answer, chunk_delay=0.3, match=slow_text))
            slow = http.post("/v1/agent", json={"message": slow_text, "chatId": uniq("slow")})
            assert slow.status_code == 202
            assert llm.script.wait_request(lambda q: slow_text in str(q["body"]), 15)
        killed_at, killed_mono = time.time(), time.monotonic()
        old = sset.kill_primary()
        promoted = sset.wait_promoted(old) - killed_mono
        deadline = time.monotonic() + 15
        while not any(m.acked and m.first_try > killed_at + promoted + 1.0
                      for c in chats for m in c.sent):
            assert time.monotonic() < deadline, "no message accepted after the failover"
            time.sleep(0.05)
        r = sset.client()  # the old one knew the dead primary
    finally:
        stop.set()
        for c in chats:
            c.join(10)
    sent = [m for c in chats for m in c.sent]
    acked = [m for m in sent if m.acked]
    with stack.http() as http:
        runs = {}
        for m in acked:
            assert m.run_id is not None
            done = http.get(f"/v1/runs/{m.run_id}/wait", params={"timeout": 20}, timeout=30)
            assert done.status_code == 200, done.text
            runs[m.message_id] = http.get(f"/v1/runs/{m.run_id}").json()
        # None lost: every acknowledged message has its own answer.
        lost = [(m.text, runs[m.message_id]["status"]) for m in acked
                if runs[m.message_id]["status"] != "ok"
                or runs[m.message_id]["reply"] != _answer(m.text)]
        assert lost == []
        # None answered twice: one terminal event per run, each reply once in its chat.
        twice = [m.text for m in acked if len(terminal_events(r, str(m.run_id))) != 1]
        for c in chats:
            history = [ChatMessage.model_validate_json(x) for x in
                       r.lrange(keys.history(f"http|{c.chat}|root"), 0, -1)]
            replies = [h.content for h in history if h.role == "assistant"]
            twice += [t for t in set(replies) if replies.count(t) > 1]
        assert twice == []
        streamed = http.get(f"/v1/runs/{slow.json()['runId']}/wait", params={"timeout": 20},
                            timeout=30).json()
        assert (streamed["status"], streamed["reply"]) == ("ok", slow_answer)
        # Same processes, still serving.
        assert [p.pid for p in stack.procs] == pids
        assert all(p.proc.poll() is None for p in stack.procs)
        after = http.post("/v1/agent", json={"message": "after", "chatId": uniq("after")})
        assert after.status_code == 202
        end = http.get(f"/v1/runs/{after.json()['runId']}/wait", params={"timeout": 20},
                       timeout=30).json()
        assert end["status"] == "ok"
    # The job kept firing across the failover, each occurrence once.
    store = JobStore(r)
    wait_until(lambda: any((x.scheduled_for or 0) > (killed_at + promoted + 1) * 1000
                           for x in store.runs(job)), 15, "a scheduled run after the failover")
    job_runs = store.runs(job)
    store.remove(job)
    r.close()

    after_kill = [m for m in acked if m.first_try > killed_at]
    first_ack = min(m.acked for m in after_kill if m.acked) - killed_at
    first_turn = min(runs[m.message_id]["endedAt"] / 1000 for m in after_kill) - killed_at
    errors = [e for m in sent for e in m.errors]
    by_status: dict[int, int] = {}
    for _, status in errors:
        by_status[status] = by_status.get(status, 0) + 1
    gap = max((t for t, _ in errors), default=killed_at) - killed_at
    fired = [x for x in job_runs if x.scheduled_for is not None]
    occurrences = [x.scheduled_for for x in fired]
    assert len(occurrences) == len(set(occurrences)), "an occurrence fired twice"
    first_job = min((x.started_at or x.ended_at) for x in fired
                    if (x.scheduled_for or 0) > killed_at * 1000) / 1000 - killed_at
    print(f"\nfailover: promoted after {promoted:.2f} s; first message accepted "
          f"{first_ack:.2f} s, first turn finished {first_turn:.2f} s and first scheduled "
          f"run started {first_job:.2f} s after the kill; "
          f"{len(errors)} refused attempts ({by_status}) over {gap:.2f} s; "
          f"{len(acked)} acknowledged, {len(after_kill)} sent after the kill")
    assert promoted < 10 and first_ack < 15
