"""Job validation, and the job store on a real (private) Redis."""

from __future__ import annotations

import pytest
import redis

from fermix_shared import keys
from fermix_shared.errors import UserInputError
from fermix_shared.models import ConversationKey
from fermix_shared.scheduling.jobs import Delivery, Job, JobRun
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobExists, JobNotFound, JobStore

NOW = 1_780_000_000_000  # 2026-05-28T20:26:40Z


@pytest.fixture
def store(r: redis.Redis) -> JobStore:
    r.flushdb()
    return JobStore(r)


def job(name: str = "daily", **kw: object) -> Job:
    schedule = make_schedule(every_s=60)
    return new_job(name=name, message="report", schedule=schedule, delivery=Delivery(),
                   trust="operator", created_by="cli", now=NOW, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one schedule"),
    ({"cron_expr": "0 9 * * *", "every_s": 5}, "exactly one schedule"),
    ({"cron_expr": "0 9 * *"}, "5 fields"),
    ({"cron_expr": "0 9 * * *", "tz": "Europe/Nowhere"}, "unknown time zone"),
    ({"every_s": 0}, "at least 1 second"),
    ({"every_s": 10, "tz": "Europe/Paris"}, "only applies"),
    ({"at": "2020-01-01T00:00:00Z"}, "is in the past"),
    ({"at": "tomorrow"}, "not an ISO-8601 time"),
])
def test_bad_schedules_are_refused_with_one_sentence(kwargs: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        make_schedule(now=NOW, **kwargs)


def test_a_naive_one_shot_time_is_in_the_given_zone() -> None:
    s = make_schedule(at="2030-01-15T09:00", tz="Europe/Paris", now=NOW)
    assert s.kind == "at" and s.at == 1_894_694_400_000  # 08:00Z


@pytest.mark.parametrize(("raw", "expected"), [
    ("none", Delivery()),
    ("telegram:-1001234:77", Delivery(mode="target", to=ConversationKey(
        channel="telegram", chat_id="-1001234", thread_scope="77"))),
    ("slack:C042:1700000000.000100", Delivery(mode="target", to=ConversationKey(
        channel="slack", chat_id="C042", thread_scope="1700000000.000100"))),
])
def test_delivery_targets(raw: str, expected: Delivery) -> None:
    assert parse_delivery(raw, None) == expected


@pytest.mark.parametrize("raw", ["email:bob", "telegram:", "telegram:abc", "origin"])
def test_bad_delivery_targets_are_refused(raw: str) -> None:
    with pytest.raises(UserInputError):
        parse_delivery(raw, None)


def test_names_and_timeouts_are_checked() -> None:
    with pytest.raises(UserInputError, match="1-64 characters"):
        job("no spaces please")
    with pytest.raises(UserInputError, match="at most 600"):
        job(timeout_s=601, max_timeout_s=600)
    assert job().timeout_s == 300


def test_add_schedules_the_first_run_and_refuses_a_duplicate_name(store: JobStore, r: redis.Redis) -> None:
    added = store.add(job(), now=NOW)
    assert added.next_run_at == NOW + 60_000
    assert store.due(NOW + 60_000) == [("daily", NOW + 60_000)]
    assert store.due(NOW + 59_999) == []
    with pytest.raises(JobExists):
        store.add(job(), now=NOW)
    replaced = store.add(job(timeout_s=30), replace=True, now=NOW + 1000)
    assert store.require("daily").timeout_s == 30 and replaced.next_run_at == NOW + 61_000


def test_pause_takes_a_job_out_of_the_due_index_and_resume_puts_it_back(store: JobStore) -> None:
    store.add(job(), now=NOW)
    paused = store.pause("daily")
    assert paused.paused and paused.next_run_at is None
    assert store.due(NOW + 10**9) == []
    resumed = store.resume("daily", now=NOW + 5000)
    assert resumed.state == "active" and resumed.next_run_at == NOW + 65_000
    assert store.due(NOW + 65_000) == [("daily", NOW + 65_000)]


def test_a_write_based_on_a_stale_read_is_refused(store: JobStore) -> None:
    store.add(job(), now=NOW)
    stale = store.raw("daily")
    store.pause("daily")
    assert not store.cas("daily", stale, job().model_copy(update={"next_run_at": 1}))
    assert store.require("daily").paused


def test_history_is_newest_first_and_capped(store: JobStore) -> None:
    store.add(job(), now=NOW)
    for i in range(keys.SCHED_RUNS_KEEP + 5):
        entry = JobRun(run_id=f"run_{i}", status="ok", ended_at=NOW + i)
        store.update("daily", lambda j: j, run=entry)
    runs = store.runs("daily")
    assert len(runs) == keys.SCHED_RUNS_KEEP
    assert runs[0].run_id == f"run_{keys.SCHED_RUNS_KEEP + 4}" and runs[-1].run_id == "run_5"


def test_remove_deletes_the_job_its_index_entry_and_its_history(store: JobStore, r: redis.Redis) -> None:
    store.add(job(), now=NOW)
    store.update("daily", lambda j: j, run=JobRun(run_id="run_1", status="ok", ended_at=NOW))
    store.remove("daily")
    assert store.get("daily") is None and store.due(NOW + 10**9) == []
    assert not r.exists(keys.sched_runs("daily"))
    with pytest.raises(JobNotFound):
        store.remove("daily")


def test_an_expiry_before_the_first_run_leaves_nothing_to_fire(store: JobStore) -> None:
    j = job(expires_at="2026-05-28T20:27:00Z")  # 20 s after NOW, the first run is at 60 s
    assert store.add(j, now=NOW).next_run_at is None
    assert store.due(NOW + 10**9) == []


def test_job_records_are_versioned() -> None:
    raw = job().model_dump() | {"schema_version": 99}
    with pytest.raises(ValueError, match="schema_version 99"):
        Job.model_validate(raw)

