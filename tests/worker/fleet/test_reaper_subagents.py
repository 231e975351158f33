"""Re-running a subagent whose worker died, on a real Redis: one execution holds a subagent, a
duplicate on a live worker stands back, the reaper takes a dead worker's subagent back and
publishes its header task again under the same ids, and the execution that lost its subagent
to the re-run reports nothing (one report counts)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.settings import Settings
from fermix_shared.task_names import SUBAGENT_RUN_TASK
from fermix_worker.fleet.heartbeat import Liveness
from fermix_worker.fleet.reaper import ReaperConfig, reap
from fermix_worker.subagents.claim import (
    Busy,
    RerunMessage,
    SubagentClaim,
    Superseded,
    counted,
    member,
    republish,
)
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.runner import SubagentJob, SubagentRunner
from fermix_worker.subagents.semaphore import FanOutSemaphore
from fermix_worker.tools import BUILTIN_TOOLS
from fermix_worker.tools.policy import ALL_POLICIES

DEAD_MS = 5000
CONFIG = ReaperConfig(Liveness(heartbeat_s=1.0, dead_s=DEAD_MS / 1000), stale_s=30,
                      stale_every_s=10, rerun_again_s=60)


def server_ms(r: redis.Redis) -> int:
    secs, micros = r.time()
    return int(secs) * 1000 + int(micros) // 1000


def beat(r: redis.Redis, worker: str, seconds_ago: float = 0) -> None:
    r.hset(keys.worker_beats(), worker, server_ms(r) - int(seconds_ago * 1000))


def message(job: dict[str, Any]) -> RerunMessage:
    return RerunMessage(task_id="task-1", group_id="group-1", group_index=1,
                        chord={"task": "fermix.subagents.resume", "args": [{"x": 1}]},
                        root_id="root-1", parent_id="parent-1", job=job)


def claim(r: redis.Redis, fanout: str, worker: str) -> SubagentClaim:
    return SubagentClaim(r, fanout, 1, worker, message({"index": 1}), dead_ms=DEAD_MS, ttl_s=60)


def reap_subagents(r: redis.Redis) -> list[str]:
    published: list[str] = []
    r.delete(keys.reaper_lock())
    reap(r, CONFIG, recover=lambda c: None, kick=lambda c: None, republish=published.append)
    return published


def report(worker: str, text: str) -> SubagentReport:
    return SubagentReport(index=1, status="completed", output=text, worker=worker)


def test_one_execution_runs_a_subagent_and_its_report_is_kept(r: redis.Redis) -> None:
    fanout = uuid.uuid4().hex
    beat(r, "w1@h:1")
    first, dup = claim(r, fanout, "w1@h:1"), claim(r, fanout, "w1@h:1")
    assert first.start() == "run"
    assert first.held()
    # A redelivery (here to the same process) while the first runs: it stands back.
    assert isinstance(dup.start(), Busy) and first.held()
    assert r.hget(keys.subagents_running(), member(fanout, 1)) == "w1@h:1"
    assert first.finish(report("w1@h:1", "found"))
    # Watched until the chord has counted the report (the task's result is stored).
    assert r.hexists(keys.subagents_running(), member(fanout, 1))
    counted(r, fanout, 1)
    assert not r.hexists(keys.subagents_running(), member(fanout, 1))
    late = claim(r, fanout, "w2@h:2")
    assert late.reported() == report("w1@h:1", "found")
    assert late.start() == report("w1@h:1", "found")
    assert 0 < r.pttl(keys.subagent_run(fanout, 1)) <= 60_000


def test_the_reaper_reruns_a_dead_workers_subagent_and_the_old_run_reports_nothing(
    r: redis.Redis,
) -> None:
    fanout = uuid.uuid4().hex
    beat(r, "w1@h:1")
    beat(r, "w2@h:2")
    old = claim(r, fanout, "w1@h:1")
    assert old.start() == "run"
    assert reap_subagents(r) == []  # its worker beats
    beat(r, "w1@h:1", seconds_ago=4)
    assert reap_subagents(r) == []  # slow, not dead
    beat(r, "w1@h:1", seconds_ago=6)
    (published,) = reap_subagents(r)
    assert RerunMessage.model_validate_json(published) == message({"index": 1})
    assert reap_subagents(r) == []  # published once, not every scan
    assert r.hget(keys.subagents_running(), member(fanout, 1)) == "requeued"
    rerun = claim(r, fanout, "w2@h:2")
    assert rerun.start() == "run"
    # The old execution was only stalled: it lost the subagent and its report is refused.
    assert not old.held()
    assert not old.finish(report("w1@h:1", "stale"))
    assert rerun.finish(report("w2@h:2", "fresh"))
    assert claim(r, fanout, "w3@h:3").reported() == report("w2@h:2", "fresh")
    counted(r, fanout, 1)
    assert reap_subagents(r) == [] and not r.exists(keys.subagents_running())


def test_a_parked_subagent_is_taken_back_by_its_own_retry_or_the_reaper_s_rerun(
    r: redis.Redis,
) -> None:
    # Issue 27: a subagent waiting for an approval is parked in its claim (its state kept).
    fanout = uuid.uuid4().hex
    beat(r, "w1@h:1")
    first = claim(r, fanout, "w1@h:1")
    assert first.start() == "run" and first.parked is None
    token = first.park('{"state": 1}')
    assert token is not None and first.park("{}") is None  # it no longer holds the subagent
    # A duplicate cannot take it while its worker beats; a stale token is a duplicate too.
    assert isinstance(claim(r, fanout, "w2@h:2").start(), Busy)
    stale = SubagentClaim(r, fanout, 1, "w2@h:2", message({"index": 1}), dead_ms=DEAD_MS,
                          ttl_s=60, park_token="not-it")
    assert isinstance(stale.start(), Busy)
    assert reap_subagents(r) == []  # parked by a live worker: nothing to re-run
    retry = SubagentClaim(r, fanout, 1, "w2@h:2", message({"index": 1}), dead_ms=DEAD_MS,
                          ttl_s=60, park_token=token)
    assert retry.start() == "run" and retry.parked == '{"state": 1}'
    assert retry.park('{"state": 2}') is not None
    beat(r, "w2@h:2", seconds_ago=6)  # the worker that parked it last died
    (published,) = reap_subagents(r)
    assert RerunMessage.model_validate_json(published).task_id == "task-1"
    rerun = claim(r, fanout, "w3@h:3")
    assert rerun.start() == "run" and rerun.parked == '{"state": 2}'
    assert rerun.finish(report("w3@h:3", "went on"))


def test_a_report_its_worker_died_before_the_chord_counted_is_sent_again(
    r: redis.Redis,
) -> None:
    fanout = uuid.uuid4().hex
    beat(r, "w1@h:1")
    done = claim(r, fanout, "w1@h:1")
    assert done.start() == "run" and done.finish(report("w1@h:1", "found"))
    assert reap_subagents(r) == []  # alive: its task is returning the report
    beat(r, "w1@h:1", seconds_ago=6)  # ... and died before Celery stored it
    (published,) = reap_subagents(r)
    assert RerunMessage.model_validate_json(published).task_id == "task-1"
    # The re-run does not run the subagent again: it returns the stored report.
    assert claim(r, fanout, "w2@h:2").start() == report("w1@h:1", "found")


def test_a_rerun_nobody_started_is_published_again_later(r: redis.Redis) -> None:
    fanout = uuid.uuid4().hex
    beat(r, "w1@h:1")
    assert claim(r, fanout, "w1@h:1").start() == "run"
    beat(r, "w1@h:1", seconds_ago=6)
    assert len(reap_subagents(r)) == 1
    r.hset(keys.subagent_run(fanout, 1), "requeued_at", server_ms(r) - 61_000)
    assert len(reap_subagents(r)) == 1


def test_a_subagent_whose_fanout_expired_is_forgotten(r: redis.Redis) -> None:
    fanout = uuid.uuid4().hex
    beat(r, "w1@h:1", seconds_ago=6)
    assert claim(r, fanout, "w1@h:1").start() == "run"
    r.delete(keys.subagent_run(fanout, 1))
    assert reap_subagents(r) == [] and not r.exists(keys.subagents_running())
    # ... and its dead worker, holding nothing any more, with it.
    reap_subagents(r)
    assert not r.hexists(keys.worker_beats(), "w1@h:1")


class RecordingApp:
    """Stands in for the Celery app: records what would be published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(self, name: str, **options: Any) -> None:
        self.sent.append((name, options))


def test_a_rerun_is_published_under_the_ids_the_chord_counts_by() -> None:
    app = RecordingApp()
    republish(app, message({"index": 1, "task": "t"}).model_dump_json())
    ((name, options),) = app.sent
    assert name == SUBAGENT_RUN_TASK
    assert options == {
        "args": [{"index": 1, "task": "t"}], "task_id": "task-1", "group_id": "group-1",
        "group_index": 1, "chord": {"task": "fermix.subagents.resume", "args": [{"x": 1}]},
        "root_id": "root-1", "parent_id": "parent-1",
    }


# --- the runner: a run that lost its subagent stops and keeps nobody's slot ---------------


@pytest.fixture
def runner(
    r: redis.Redis, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> SubagentRunner:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    settings = Settings(provider="openai", model="scripted-openai", cancel_poll_seconds=0.05)
    return SubagentRunner(r, settings, BUILTIN_TOOLS)


def subagent_job(r: redis.Redis, task: str) -> SubagentJob:
    conv = f"http|{uuid.uuid4().hex}|root"
    r.hset(keys.active(conv), mapping={"turn_id": "run_p", "worker": "parked:run_p"})
    return SubagentJob(
        fanout_id=uuid.uuid4().hex, index=1, task=task, conv=conv, parent_run="run_p",
        trust="operator", profile="default", result_format="concise", parent_model="m",
        parent_tools=None, parent_policies=sorted(ALL_POLICIES),
        concurrency=1, timeout_s=30, deadline_at=time.time() + 30, slots_ttl_s=60)


def test_a_run_taken_over_by_a_rerun_stops_and_reports_nothing(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner
) -> None:
    task = f"task-{uuid.uuid4().hex[:8]}"
    llm.script.push(Reply(text="too late", delay=1, match=task))
    job = subagent_job(r, task)
    beat(r, "w1@h:1")
    old = SubagentClaim(r, job.fanout_id, 1, "w1@h:1", message(job.model_dump()),
                        dead_ms=DEAD_MS, ttl_s=60)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(runner.run(job, "w1@h:1", old)))
    t.start()
    assert llm.script.wait_request(lambda q: task in json.dumps(q["body"]), 5)
    beat(r, "w1@h:1", seconds_ago=6)  # its worker looks dead: the reaper re-runs it
    assert len(reap_subagents(r)) == 1
    beat(r, "w2@h:2")
    rerun = SubagentClaim(r, job.fanout_id, 1, "w2@h:2", message(job.model_dump()),
                          dead_ms=DEAD_MS, ttl_s=60)
    assert rerun.start() == "run"
    # (Under gevent the watch cuts the model call short; in a plain thread it ends first.)
    t.join(5)
    assert out == [Superseded()]
    # The slot (one per subagent) is the re-run's now: the old run did not give it back.
    assert FanOutSemaphore(r, job.fanout_id, 1, 60).holders() == ["1"]
    assert rerun.held()
