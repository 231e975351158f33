"""The scheduler's decisions (missed runs, backoff, disable) and overlapping ticks on a real
(private) Redis. The fleet behaviour with real beat and worker processes is in
``test_scheduler_fleet.py``."""

from __future__ import annotations

import threading

import redis

from fermix_shared import keys
from fermix_shared.models import InboundMessage, RunRecord, RunStatus
from fermix_shared.scheduling.jobs import Delivery, Job
from fermix_shared.scheduling.parse import make_schedule, new_job
from fermix_shared.scheduling.store import JobStore
from fermix_shared.stores import queue
from fermix_worker.scheduling.ticker import (
    DISABLE_AFTER,
    RecordJobRun,
    Ticker,
    after_run,
    backoff_s,
    plan_occurrence,
)
from fermix_worker.turn.listeners import TurnEnded

T0 = 1_780_000_000_000


def every(seconds: int, name: str = "tick", **kw: object) -> Job:
    j = new_job(name=name, message=f"job {name}", schedule=make_schedule(every_s=seconds),
                delivery=Delivery(), trust="operator", created_by="test", now=T0)
    return j.model_copy(update={"next_run_at": T0, **kw})


def test_an_on_time_occurrence_fires_and_keeps_the_cadence() -> None:
    plan = plan_occurrence(every(2), T0, T0 + 300)
    assert plan.fire and plan.job.next_run_at == T0 + 2000


def test_occurrences_missed_while_beat_was_down_fire_once_then_the_schedule_resumes() -> None:
    # Ten minutes of a one-minute job were missed: one run, next at the next minute after now.
    now = T0 + 10 * 60_000 + 5000
    plan = plan_occurrence(every(60), T0, now)
    assert plan.fire
    assert plan.job.next_run_at == T0 + 11 * 60_000
    # A daily cron missed by hours: one run now, then the next regular 09:00.
    daily = every(1).model_copy(update={"schedule": make_schedule(cron_expr="0 9 * * *", tz="Europe/Paris")})
    nine = 1_780_297_200_000  # 2026-06-01T07:00Z = 09:00 CEST
    plan = plan_occurrence(daily.model_copy(update={"next_run_at": nine}), nine, nine + 5 * 3600_000)
    assert plan.fire and plan.job.next_run_at == nine + 24 * 3600_000


def test_a_one_shot_fires_once_then_is_done_and_an_expired_job_does_not_fire() -> None:
    once = every(1).model_copy(update={"schedule": make_schedule(at="2099-01-01T00:00:00Z")})
    plan = plan_occurrence(once, T0, T0)
    assert plan.fire and plan.job.next_run_at is None and plan.job.state == "disabled (done)"
    plan = plan_occurrence(every(1, expires_at=T0), T0, T0)
    assert not plan.fire and plan.job.state == "disabled (expired)"


def test_paused_or_stale_entries_do_not_fire() -> None:
    assert not plan_occurrence(every(1, paused=True), T0, T0).fire
    assert not plan_occurrence(every(1), T0 - 1000, T0).fire  # the job moved on already


def test_backoff_numbers() -> None:
    assert [backoff_s(n) for n in range(1, 10)] == [0, 0, 60, 120, 240, 480, 960, 1920, 3600]
    assert DISABLE_AFTER == 10


def test_repeated_failures_back_off_then_disable_and_a_success_resets() -> None:
    job = every(60)
    for _ in range(2):
        job = after_run(job, RunStatus.error, T0)
        assert job.next_run_at == T0  # no backoff yet
    job = after_run(job, RunStatus.error, T0)
    assert job.consecutive_failures == 3 and job.next_run_at == T0 + 60_000
    assert after_run(job, RunStatus.stopped, T0).consecutive_failures == 3
    assert after_run(job, RunStatus.ok, T0).consecutive_failures == 0
    for _ in range(DISABLE_AFTER - 3):
        job = after_run(job, RunStatus.error, T0)
    assert job.state == f"disabled ({DISABLE_AFTER} consecutive failures)"
    assert job.next_run_at is None


def test_overlapping_ticks_queue_one_run_per_occurrence(r: redis.Redis) -> None:
    r.flushdb()
    JobStore(r).cas("tick", None, every(2))
    kicked: list[str] = []
    barrier = threading.Barrier(4)

    def tick() -> None:
        barrier.wait()
        Ticker(r, kicked.append, clock=lambda: T0 + 100).tick()

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(kicked) == 1
    conv = kicked[0]
    assert conv.startswith("schedule|tick|run_") and r.llen(keys.inbox(conv)) == 1
    assert JobStore(r).require("tick").next_run_at == T0 + 2000
    # The same occurrence again (a late duplicate tick) is refused by the de-duplication mark.
    again = Ticker(r, kicked.append, clock=lambda: T0 + 200)
    JobStore(r).update("tick", lambda j: j.model_copy(update={"next_run_at": T0}))
    assert again.tick() == [] and len(kicked) == 1
    assert JobStore(r).require("tick").next_run_at == T0 + 2000


def test_a_finished_run_goes_to_the_history_and_its_conversation_expires(r: redis.Redis) -> None:
    r.flushdb()
    store = JobStore(r)
    store.cas("tick", None, every(2))
    Ticker(r, lambda conv: None, clock=lambda: T0 + 61_000 + 2000).tick()  # a catch-up
    conv = next(iter(r.zrange(keys.queued_index(), 0, -1)))
    claim, lease = queue.claim(r, conv, "w1", 30)
    msg: InboundMessage = claim.messages[0]
    assert (msg.job, msg.context, msg.scheduled_for, msg.trust) == ("tick", "scheduled", T0, "operator")
    r.rpush(keys.history(conv), "{}")
    record = RunRecord(run_id=msg.run_id, conversation=msg.key, status=RunStatus.ok,
                       reply=None, started_at=T0 / 1000 + 63, ended_at=T0 / 1000 + 64)
    RecordJobRun(r)(TurnEnded(msg, record, usage=(7, 3)))
    (run,) = store.runs("tick")
    assert (run.input_tokens, run.output_tokens) == (7, 3)
    assert (run.status, run.trigger, run.delivery, run.scheduled_for) == ("ok", "catch_up", "silent", T0)
    assert run.ended_at - (run.started_at or 0) == 1000
    assert 0 < r.ttl(keys.history(conv)) <= keys.SCHED_RUN_HISTORY_TTL_SECONDS
