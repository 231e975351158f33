"""The Redis primary dies under load and Sentinel promotes a replica (issue 19 item 2).

A gateway and two workers know Redis only through three sentinels (``FERMIX_REDIS_SENTINELS``,
``FERMIX_REDIS_MASTER``; the URL's host names nothing that runs). Six chats post at a steady
rate, each retrying a 503 with the same ``messageId`` as a platform retries a webhook. The
primary is SIGKILLed mid-load; one of its two replicas is promoted (two, so the new master
still has one replica and the gateway's WAIT 1 can be met).

A beat, also configured only through the sentinels, fires an every-second job throughout.

What a user would notice: every message the gateway acknowledged with 2xx is answered, none
twice; the job keeps firing, each occurrence once; the processes carry on without a restart.
Measured (printed, and in docs/operations/redis-sentinel.md): kill to promotion, to the first
accepted message, to the first finished turn, to the first scheduled run, and the 503s seen
in between.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import Managed, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import (
    all_sent,
    finished_runs,
    posting_chats,
    repeated_replies,
    terminal_events,
    uniq,
    wait_acked,
)
from tests.sentinels import SentinelSet

CHATS = 6
PERIOD_S = 0.25  # each chat posts this often: 24 messages a second in all
# (a 503 is retried after 0.1 s, tests/fleet.py PostingChat: a platform honours Retry-After: 1 s)


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
    with posting_chats(stack.url, "fo", CHATS, PERIOD_S) as chats:
        with stack.http() as http:  # load runs and turns finish before the kill
            wait_acked(chats, 3 * CHATS, 15)
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
                      for m in all_sent(chats)):
            assert time.monotonic() < deadline, "no message accepted after the failover"
            time.sleep(0.05)
        r = sset.client()  # the old one knew the dead primary
    sent = all_sent(chats)
    acked = [m for m in sent if m.acked]
    with stack.http() as http:
        runs = finished_runs(http, acked, 20)
        # None lost: every acknowledged message has its own answer.
        lost = [(m.text, runs[m.message_id]["status"]) for m in acked
                if runs[m.message_id]["status"] != "ok"
                or runs[m.message_id]["reply"] != _answer(m.text)]
        assert lost == []
        # None answered twice: one terminal event per run, each reply once in its chat.
        twice = [m.text for m in acked if len(terminal_events(r, str(m.run_id))) != 1]
        twice += repeated_replies(r, [c.chat for c in chats])
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
