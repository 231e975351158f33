"""Replay and fork over HTTP: ``POST /v1/runs/{runId}/replay`` and ``POST
/v1/runs/{runId}/fork`` (what ``fermix replay`` and ``fermix fork`` call), and
``GET /v1/runs/{runId}/record`` (the record's size).

The work runs on a worker (it has the code, configuration and tools a turn runs on): the
route sends ``fermix.recorder.replay`` or ``fermix.recorder.fork`` and waits for the report on
``keys.recorder_job`` (BLPOP), answering 504 when no worker answered in time. A replay changes
nothing but takes a worker's time; a fork calls a model (and, with ``liveTools``, runs
tools) and is audited. Both take the operator role, as every ``/v1`` write does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from fermix_gateway.api.run_bodies import ForkReport, RecordSize, ReplayReport
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Operator
from fermix_shared import audit, keys
from fermix_shared import recorder as rec
from fermix_shared.task_names import FORK_TASK, REPLAY_TASK

router = v1_router()
# What a worker's job may answer besides its report (its refusal carries its own status).
WORKER_REFUSALS = {422: "A bad body, or the worker refused the job (the reason says why).",
                   500: "The worker failed running the job (the reason names the error).",
                   504: "No worker answered in time (is a worker running?)."}
NO_RECORD = {404: "The run has no record (the recorder keeps one for `recorder.keep_days`, "
                  "when it is on)."}

# How long the route waits for the worker's report: a replay calls nothing; a fork waits for
# its model calls (each within the provider timeout), bounded here.
REPLAY_WAIT_SECONDS = 60
FORK_WAIT_SECONDS = 300


class ReplayBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(default=None, ge=1, description="stop after this step, and show it")


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    step: int = Field(default=1, ge=1, description="the first step the fork runs anew")
    model: str | None = Field(default=None, min_length=1, max_length=200)
    agent: str | None = Field(default=None, min_length=1, max_length=100)
    prompt: str | None = Field(default=None, min_length=1, max_length=200_000)
    live_tools: bool = Field(default=False, alias="liveTools")


async def _job(request: Request, task: str, run_id: str, options: dict[str, Any],
               wait_s: int) -> dict[str, Any]:
    r = request.app.state.redis
    if not await rec.exists_async(r, run_id):
        keep = request.app.state.settings.recorder.keep_days
        raise HTTPException(404, f"run {run_id} has no record (the recorder keeps a run's "
                                 f"record for {keep:g} days, when it is on)")
    return await worker_job(request, task, [run_id, json.dumps(options)], wait_s)


async def worker_job(request: Request, task: str, args: list[Any], wait_s: int) -> dict[str, Any]:
    """Send ``task`` (its job id first, then ``args``) and wait for the worker's answer on
    ``keys.recorder_job``: its ``ok`` body, or its refusal as an HTTPException (504 when no
    worker answered within ``wait_s``)."""
    r = request.app.state.redis
    job_id = uuid.uuid4().hex
    request.app.state.tasks.send(task, [job_id, *args])
    got = None
    deadline = time.monotonic() + wait_s
    while got is None and time.monotonic() < deadline:
        # A second at a time: the gateway's Redis socket times out long before a fork ends.
        got = await r.blpop([keys.recorder_job(job_id)], timeout=1)
    if got is None:
        raise HTTPException(504, f"no worker answered within {wait_s} s (is a worker running?)")
    body: dict[str, Any] = json.loads(got[1])
    if "error" in body:
        raise HTTPException(int(body.get("status", 422)), str(body["error"]))
    out: dict[str, Any] = body["ok"]
    return out


@router.post("/runs/{run_id}/replay", response_model=ReplayReport,
             responses=refusals({**NO_RECORD, **WORKER_REFUSALS}))
async def replay_run(run_id: str, request: Request, who: Operator,
                     body: ReplayBody | None = None) -> dict[str, Any]:
    """Re-run the turn against its recorded responses and results: whether it reproduces
    (same tool calls, same reply) or the first step where it diverges."""
    options = {"step": body.step} if body is not None and body.step is not None else {}
    return await _job(request, REPLAY_TASK, run_id, options, REPLAY_WAIT_SECONDS)


@router.post("/runs/{run_id}/fork", response_model=ForkReport,
             responses=refusals({**NO_RECORD, **WORKER_REFUSALS}))
async def fork_run(run_id: str, body: ForkBody, request: Request,
                   who: Operator) -> dict[str, Any]:
    """Continue the turn from ``step`` on another model, agent or prompt in a scratch
    conversation; the original and the fork side by side."""
    if body.model is None and body.agent is None and body.prompt is None:
        raise HTTPException(422, "a fork needs a model, an agent or a prompt to differ by")
    options = {"step": body.step, "model": body.model, "agent": body.agent,
               "prompt": body.prompt, "live_tools": body.live_tools, "trust": "operator",
               "actor": who.actor}
    report = await _job(request, FORK_TASK, run_id, options, FORK_WAIT_SECONDS)
    await audit.arecord(request.app.state.redis, "agent", "run.fork", "ok", actor=who.actor,
                        run=run_id, fork=report["fork"]["runId"], step=body.step,
                        model=body.model or "", fork_agent=body.agent or "",
                        prompt=body.prompt is not None,
                        live_tools=body.live_tools)
    return report


@router.get("/runs/{run_id}/record", response_model=RecordSize,
            responses=refusals({404: "The run has no record."}))
async def record_size(run_id: str, request: Request) -> dict[str, Any]:
    """The run's record: how many entries and bytes it holds (404 without one)."""
    r = request.app.state.redis
    entries, size = await rec.size_async(r, run_id)
    if not entries:
        raise HTTPException(404, f"run {run_id} has no record")
    return {"runId": run_id, "entries": entries, "bytes": size}
