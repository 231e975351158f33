"""Evaluation over HTTP: ``POST /v1/evals/run`` runs one case of a suite on a worker (what
``fermix eval`` calls, once per case × agent × model × repeat, a bounded number at a time),
and ``GET /v1/runs/{runId}/case`` makes a recorded run a case (``fermix eval --from-run``).

A case run calls models and runs tools as an operator's turn does (fermix_worker/evals/run.py),
so it takes the operator role and is audited (``eval.run``); the case is checked here first,
so a bad one is a 422 naming the key, not a worker's error. The worker answers on
``keys.recorder_job`` as a fork's does (fermix_gateway/api/recorder.py).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from fermix_gateway.api.recorder import NO_RECORD, WORKER_REFUSALS, worker_job
from fermix_gateway.api.run_bodies import EvalResult, RunCase
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Operator
from fermix_shared import audit
from fermix_shared import recorder as rec
from fermix_shared.evals.from_run import NotACase, case_from_recording
from fermix_shared.evals.suite import SuiteError, parse
from fermix_shared.task_names import EVAL_TASK

router = v1_router()

# A case's turns, each bounded by the provider's timeouts and the loop's caps; bounded here.
EVAL_WAIT_SECONDS = 600


class EvalBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suite: str = Field(default="suite", min_length=1, max_length=100)
    case: dict[str, Any]
    agent: str = Field(default="default", min_length=1, max_length=100)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    grader: str | None = Field(default=None, min_length=1, max_length=200)
    repeat: int = Field(default=1, ge=1, le=1000)


@router.post("/evals/run", response_model=EvalResult, responses=refusals(WORKER_REFUSALS))
async def run_case(body: EvalBody, request: Request, who: Operator) -> dict[str, Any]:
    """Run one case on ``agent`` (and ``model``) and check it: whether it passed, each failed
    expectation in a sentence, its reply, tool calls, steps, tokens, cost and latency."""
    try:
        case = parse({"cases": [body.case]}, "case").cases[0]
    except SuiteError as e:
        raise HTTPException(422, str(e).removeprefix("case: ")) from None
    options = {"suite": body.suite, "case": case.model_dump(mode="json"), "agent": body.agent,
               "model": body.model, "grader": body.grader, "repeat": body.repeat,
               "actor": who.actor}
    run = await worker_job(request, EVAL_TASK, [json.dumps(options)], EVAL_WAIT_SECONDS)
    await audit.arecord(request.app.state.redis, "agent", "eval.run", "ok", actor=who.actor,
                        suite=body.suite, case=case.name[:100], eval_agent=body.agent,
                        model=body.model or "", run=run["runId"], passed=run["passed"])
    return run


@router.get("/runs/{run_id}/case", response_model=RunCase, responses=refusals({
    **NO_RECORD, 422: "The record is not a turn's (the reason says why)."}))
async def run_as_case(run_id: str, request: Request) -> dict[str, Any]:
    """The recorded run as an eval case (a suite's ``[[case]]``), its reply the reference."""
    recording = await rec.read_async(request.app.state.redis, run_id)
    if recording is None:
        keep = request.app.state.settings.recorder.keep_days
        raise HTTPException(404, f"run {run_id} has no record (the recorder keeps a run's "
                                 f"record for {keep:g} days, when it is on)")
    try:
        return {"runId": run_id, "case": case_from_recording(recording)}
    except NotACase as e:
        raise HTTPException(422, str(e)) from None
