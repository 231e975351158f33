"""``/v1/schedules``: scheduled jobs over HTTP, on the gateway in this process (TestClient) over
a private Redis (scratch database 10), the task publisher recorded. Every role lists a job
with its next run and history; an operator pauses, resumes and runs one now (a queued run in
a conversation of its own, its dispatch sent); only an admin deletes one; an unknown job is a
404 with the reason; every change is an audit entry naming the caller's token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.audit.store import AuditLog
from fermix_shared.hooks import HookRegistry
from fermix_shared.scheduling.jobs import Job, JobRun, Schedule, now_ms
from fermix_shared.scheduling.store import JobStore
from fermix_shared.settings import Settings
from tests.gateway.inprocess import DISPATCH_TASK, RecordingCelery

TOKEN = "sched-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
HOUR_S = 3600


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(scratch_redis_url.rsplit("/", 1)[0] + "/10", decode_responses=True)
    r.flushdb()
    yield r
    r.close()


@pytest.fixture
def gw(db: redis.Redis, scratch_redis_url: str) -> Iterator[tuple[TestClient, RecordingCelery]]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/10"
    app = create_app(Settings(redis_url=url, api_token=TOKEN), hooks=HookRegistry())
    celery = RecordingCelery()
    app.state.tasks = celery
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, celery


@pytest.fixture
def client(gw: tuple[TestClient, RecordingCelery]) -> TestClient:
    return gw[0]


def make(client: TestClient, name: str, role: str) -> dict[str, str]:
    resp = client.post("/v1/tokens", json={"name": name, "role": role}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def add_job(r: redis.Redis, name: str, runs: int = 0) -> Job:
    """An hourly job of ``default`` with ``runs`` finished runs in its history (the newest
    last made, an error every third)."""
    store = JobStore(r)
    job = store.add(Job(name=name, schedule=Schedule(kind="every", every_s=HOUR_S),
                        message=f"report for {name}"))
    for i in range(runs):
        run = JobRun(run_id=f"run_{name}_{i}", status="error" if i % 3 == 2 else "ok",
                     started_at=1_000_000 + i * 1000, ended_at=1_000_500 + i * 1000,
                     output=f"answer {i}")
        job = store.update(name, lambda j, t=run.ended_at: j.model_copy(
            update={"last_run_at": t}), run=run)
    return job


def actions(r: redis.Redis) -> list[tuple[str, str, str, str, object]]:
    """The audit trail's entries, oldest first: kind, action, outcome, actor, job."""
    return [(e.kind, e.action, e.outcome, e.actor, e.detail.get("job"))
            for e in reversed(AuditLog(r).recent())]


def test_every_role_lists_the_jobs_with_next_run_and_last_runs(
    client: TestClient, db: redis.Redis
) -> None:
    daily = add_job(db, "daily", runs=7)
    quiet = add_job(db, "quiet")
    viewer = make(client, "vic", "viewer")
    resp = client.get("/v1/schedules", headers=viewer)
    assert resp.status_code == 200, resp.text
    listed = resp.json()["schedules"]
    assert [j["name"] for j in listed] == ["daily", "quiet"]
    first = listed[0]
    assert {k: first[k] for k in ("agent", "trust", "schedule", "state", "nextRunAt",
                                  "lastRunAt", "delivery", "paused")} == {
        "agent": "default", "trust": "operator", "schedule": f"every {HOUR_S}s",
        "state": "active", "nextRunAt": daily.next_run_at, "lastRunAt": 1_006_500,
        "delivery": "none", "paused": False}
    assert daily.next_run_at is not None and daily.next_run_at > now_ms()
    # The five newest runs, newest first, with their status and times.
    assert [(r["runId"], r["status"]) for r in first["runs"]] == [
        ("run_daily_6", "ok"), ("run_daily_5", "error"), ("run_daily_4", "ok"),
        ("run_daily_3", "ok"), ("run_daily_2", "error")]
    assert (first["runs"][0]["startedAt"], first["runs"][0]["endedAt"]) == (1_006_000, 1_006_500)
    assert listed[1]["runs"] == [] and listed[1]["nextRunAt"] == quiet.next_run_at
    # The whole history with the job's task, for any role too.
    detail = client.get("/v1/schedules/daily", headers=viewer).json()
    assert [r["runId"] for r in detail["runs"]] == [f"run_daily_{i}" for i in range(6, -1, -1)]
    assert (detail["message"], detail["createdBy"], detail["allowedTools"]) == (
        "report for daily", "cli", None)
    assert detail["runs"][0]["output"] == "answer 6"
    assert client.get("/v1/schedules").status_code == 401


def test_an_unknown_job_is_a_404_with_the_reason(client: TestClient) -> None:
    why = "no scheduled job named 'nope'"
    for method, path in (("GET", "/v1/schedules/nope"), ("POST", "/v1/schedules/nope/pause"),
                         ("POST", "/v1/schedules/nope/resume"),
                         ("POST", "/v1/schedules/nope/run"), ("DELETE", "/v1/schedules/nope")):
        resp = client.request(method, path, headers=ADMIN)
        assert (resp.status_code, resp.json()) == (404, {"error": why}), (method, path)


def test_an_operator_pauses_and_resumes_a_job_and_a_viewer_may_not(
    client: TestClient, db: redis.Redis
) -> None:
    add_job(db, "daily")
    viewer, operator = make(client, "vic", "viewer"), make(client, "olga", "operator")
    for action in ("pause", "resume", "run"):
        resp = client.post(f"/v1/schedules/daily/{action}", headers=viewer)
        assert (resp.status_code, resp.json()["error"]) == (
            403, "this needs the operator role; the token 'vic' is a viewer"), action
    assert db.zscore(keys.sched_due(), "daily") is not None

    paused = client.post("/v1/schedules/daily/pause", headers=operator)
    assert paused.status_code == 200, paused.text
    assert (paused.json()["state"], paused.json()["nextRunAt"], paused.json()["paused"]) == (
        "paused", None, True)
    assert db.zscore(keys.sched_due(), "daily") is None  # it cannot fire
    listed = client.get("/v1/schedules", headers=viewer).json()["schedules"]
    assert (listed[0]["state"], listed[0]["nextRunAt"]) == ("paused", None)

    resumed = client.post("/v1/schedules/daily/resume", headers=operator).json()
    assert (resumed["state"], resumed["paused"]) == ("active", False)
    assert resumed["nextRunAt"] > now_ms()
    assert db.zscore(keys.sched_due(), "daily") == resumed["nextRunAt"]
    assert [a for a in actions(db) if a[0] == "admin" and a[1].startswith("schedule.")] == [
        ("admin", "schedule.pause", "ok", "http:olga", "daily"),
        ("admin", "schedule.resume", "ok", "http:olga", "daily")]


def test_run_now_queues_a_run_of_its_own_and_dispatches_it(
    gw: tuple[TestClient, RecordingCelery], db: redis.Redis
) -> None:
    client, celery = gw
    job = add_job(db, "daily")
    operator = make(client, "olga", "operator")
    resp = client.post("/v1/schedules/daily/run", headers=operator)
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["runId"]
    assert run_id.startswith("run_")
    conv = f"schedule|daily|{run_id}"
    # The run is queued in a conversation of its own, its dispatch sent.
    run = client.get(f"/v1/runs/{run_id}", headers=operator).json()
    assert run["status"] == "queued"
    assert db.zscore(keys.queued_index(), conv) is not None
    assert [m for m in db.lrange(keys.inbox(conv), 0, -1) if run_id in m]
    assert celery.named(DISPATCH_TASK) == [[conv]]
    # Its schedule is as it was; a second run now is another run.
    assert resp.json()["nextRunAt"] == job.next_run_at == db.zscore(keys.sched_due(), "daily")
    again = client.post("/v1/schedules/daily/run", headers=operator).json()["runId"]
    assert again != run_id
    entries = [e for e in AuditLog(db).recent() if e.action == "schedule.run_now"]
    assert [(e.actor, e.detail["job"], e.detail["started_run"]) for e in reversed(entries)] == [
        ("http:olga", "daily", run_id), ("http:olga", "daily", again)]


def test_only_an_admin_deletes_a_job_and_its_history(
    client: TestClient, db: redis.Redis
) -> None:
    add_job(db, "daily", runs=2)
    operator, admin = make(client, "olga", "operator"), make(client, "ada", "admin")
    refused = client.delete("/v1/schedules/daily", headers=operator)
    assert (refused.status_code, refused.json()["error"]) == (
        403, "this needs the admin role; the token 'olga' is an operator")
    assert db.hexists(keys.sched_jobs(), "daily")

    resp = client.delete("/v1/schedules/daily", headers=admin)
    assert (resp.status_code, resp.json()) == (200, {"removed": "daily"})
    assert not db.hexists(keys.sched_jobs(), "daily")
    assert not db.exists(keys.sched_runs("daily"))
    assert db.zscore(keys.sched_due(), "daily") is None
    assert client.get("/v1/schedules", headers=admin).json() == {"schedules": []}
    assert client.get("/v1/schedules/daily", headers=admin).status_code == 404
    assert ("admin", "schedule.remove", "ok", "http:ada", "daily") in actions(db)
    refusal = [e for e in AuditLog(db).recent() if e.action == "role"][0]
    assert (refusal.actor, refusal.detail["route"]) == ("http:olga", "DELETE /v1/schedules/daily")
