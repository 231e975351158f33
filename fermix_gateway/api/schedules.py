"""Scheduled jobs over HTTP, as ``fermix schedule`` manages them (fermix_shared/scheduling/):

* ``GET /v1/schedules``: every job (name, agent, trust, schedule, state, ``nextRunAt`` in ms,
  delivery, ``lastRunAt``) with its :data:`LAST_RUNS` newest runs (any role);
* ``GET /v1/schedules/{name}``: one job, its task and its whole kept run history (any role);
* ``POST /v1/schedules/{name}/pause``, ``/resume`` and ``/run`` (a run now, in its own
  conversation, as ``fermix schedule run-now``: 202 with its ``runId``), for operators;
* ``DELETE /v1/schedules/{name}``: the job and its history, for admins.

An unknown job is 404 with the reason. Each change is an audit entry (``admin``,
``schedule.pause`` / ``schedule.resume`` / ``schedule.run_now`` / ``schedule.remove``, the
actions the CLI and the agent tools record) naming the caller's token.

Reads use the gateway's asyncio client. The store's changes are compare-and-set scripts over
a synchronous client (:class:`~fermix_shared.scheduling.store.JobStore`, shared with the CLI,
the tools and the scheduler), so a change runs in a thread with a short-lived client of the
deployment's Redis (Sentinel included); a run's dispatch goes through the gateway's task
publisher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from fastapi import HTTPException, Request
from pydantic import ValidationError

from fermix_gateway.api.admin_bodies import Job as JobBody
from fermix_gateway.api.admin_bodies import JobDetail, JobRemoved, Jobs, JobStarted
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Admin, Operator
from fermix_shared import audit, keys
from fermix_shared.redis.client import CLI_OUTAGE_S, client_for_settings
from fermix_shared.scheduling.firing import enqueue_run
from fermix_shared.scheduling.jobs import Job, JobRun
from fermix_shared.scheduling.store import JobNotFound, JobStore, jobs_async
from fermix_shared.task_names import DISPATCH_TASK

router = v1_router()
REFUSED = refusals({404: "No job of that name.",
                    409: "Another release wrote the job, or it is being changed right now."})
# The newest runs each job lists with it in GET /v1/schedules.
LAST_RUNS = 5
T = TypeVar("T")


def run_json(run: JobRun) -> dict[str, Any]:
    """One entry of a job's run history (times in ms since the epoch)."""
    return {"runId": run.run_id, "status": run.status, "trigger": run.trigger,
            "scheduledFor": run.scheduled_for, "startedAt": run.started_at,
            "endedAt": run.ended_at, "output": run.output, "inputTokens": run.input_tokens,
            "outputTokens": run.output_tokens, "delivery": run.delivery}


def job_json(job: Job, runs: list[JobRun]) -> dict[str, Any]:
    """A job as ``GET /v1/schedules`` lists it (the fields of ``/v1/status``'s ``schedules``
    and more), with ``runs``, newest first."""
    return {"name": job.name, "agent": job.agent, "trust": job.trust,
            "schedule": job.schedule.describe(), "state": job.state,
            "nextRunAt": job.next_run_at, "lastRunAt": job.last_run_at,
            "delivery": job.delivery.describe(), "paused": job.paused,
            "consecutiveFailures": job.consecutive_failures,
            "runs": [run_json(r) for r in runs]}


def _parse_runs(raw: list[Any]) -> list[JobRun]:
    """The history entries this release can read (another version's are left out)."""
    out = []
    for item in raw:
        try:
            out.append(JobRun.model_validate_json(item))
        except ValidationError:
            continue
    return out


async def _runs(r: Any, names: list[str], limit: int) -> list[list[JobRun]]:
    """The newest ``limit`` runs of each job, in one round trip."""
    async with r.pipeline(transaction=False) as p:
        for name in names:
            p.lrange(keys.sched_runs(name), 0, limit - 1)
        found = await p.execute()
    return [_parse_runs(list(raw)) for raw in found]


async def read_job(r: Any, name: str) -> Job:
    """The stored job, or a 404 naming it (409 for a record of another release)."""
    raw = await r.hget(keys.sched_jobs(), name)
    if not raw:
        raise HTTPException(404, str(JobNotFound(name)))
    try:
        return Job.model_validate_json(raw)
    except ValidationError as e:
        raise HTTPException(409, f"the scheduled job {name!r} was written by another "
                                 "release of Fermix and cannot be read here") from e


async def in_store(request: Request, change: Callable[[redis.Redis, JobStore], T]) -> T:
    """Run ``change`` in a thread over a client of its own (closed after); a missing job is
    a 404 with the reason."""
    settings = request.app.state.settings

    def work() -> T:
        r = client_for_settings(settings, max_connections=2, outage_s=CLI_OUTAGE_S)
        try:
            return change(r, JobStore(r))
        finally:
            r.connection_pool.disconnect()

    try:
        return await asyncio.to_thread(work)
    except JobNotFound as e:
        raise HTTPException(404, str(e)) from e
    except RuntimeError as e:  # the CAS kept losing: someone is changing it right now
        raise HTTPException(409, str(e)) from e


@router.get("/schedules", response_model=Jobs)
async def list_schedules(request: Request) -> dict[str, Any]:
    """Every job by name, with its newest runs."""
    r = request.app.state.redis
    jobs = await jobs_async(r)
    runs = await _runs(r, [j.name for j in jobs], LAST_RUNS)
    return {"schedules": [job_json(j, h) for j, h in zip(jobs, runs, strict=True)]}


@router.get("/schedules/{name}", response_model=JobDetail, responses=REFUSED)
async def get_schedule(name: str, request: Request) -> dict[str, Any]:
    """One job with its task, limits and whole kept run history (newest first)."""
    r = request.app.state.redis
    job = await read_job(r, name)
    (runs,) = await _runs(r, [name], keys.SCHED_RUNS_KEEP)
    return {**job_json(job, runs), "message": job.message, "allowedTools": job.allowed_tools,
            "timeoutS": job.timeout_s, "createdBy": job.created_by,
            "createdAt": job.created_at, "expiresAt": job.expires_at,
            "disabledReason": job.disabled_reason}


async def _changed(request: Request, job: Job, action: str, actor: str,
                   **detail: str) -> dict[str, Any]:
    r = request.app.state.redis
    await audit.arecord(r, "admin", action, "ok", actor=actor, job=job.name, agent=job.agent,
                        **detail)
    (runs,) = await _runs(r, [job.name], LAST_RUNS)
    return job_json(job, runs)


@router.post("/schedules/{name}/pause", response_model=JobBody, responses=REFUSED)
async def pause_schedule(name: str, request: Request, who: Operator) -> dict[str, Any]:
    """Stop the job firing until it is resumed (a run in flight still finishes)."""
    job = await in_store(request, lambda _, store: store.pause(name))
    return await _changed(request, job, "schedule.pause", who.actor)


@router.post("/schedules/{name}/resume", response_model=JobBody, responses=REFUSED)
async def resume_schedule(name: str, request: Request, who: Operator) -> dict[str, Any]:
    """Resume a paused or disabled job: its failures start over and its next run is set."""
    job = await in_store(request, lambda _, store: store.resume(name))
    return await _changed(request, job, "schedule.resume", who.actor)


@router.post("/schedules/{name}/run", status_code=202, response_model=JobStarted,
             responses=REFUSED)
async def run_schedule_now(name: str, request: Request, who: Operator) -> dict[str, Any]:
    """Queue one run of the job now, in a conversation of its own (``schedule|<job>|<run
    id>``), whatever its state; its schedule is unchanged. 202 with ``runId`` (follow it with
    ``GET /v1/runs/{runId}``)."""
    tasks = request.app.state.tasks

    def kick(conv: str) -> None:
        tasks.send(DISPATCH_TASK, [conv])

    def start(r: redis.Redis, store: JobStore) -> tuple[Job, str]:
        job = store.require(name)
        return job, enqueue_run(r, job, kick, scheduled_for=None).run_id

    job, run_id = await in_store(request, start)
    body = await _changed(request, job, "schedule.run_now", who.actor, started_run=run_id)
    return {**body, "runId": run_id}


@router.delete("/schedules/{name}", response_model=JobRemoved, responses=REFUSED)
async def delete_schedule(name: str, request: Request, who: Admin) -> dict[str, Any]:
    """Delete the job and its run history (a run in flight still finishes)."""
    await in_store(request, lambda _, store: store.remove(name))
    await audit.arecord(request.app.state.redis, "admin", "schedule.remove", "ok",
                        actor=who.actor, job=name)
    return {"removed": name}
