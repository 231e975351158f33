# mypy: disallow-untyped-decorators=False
"""``fermix.eval.run``: one run of an eval case (fermix_worker/evals/run.py) on whichever
worker takes it, its result handed to the gateway that waits (``keys.recorder_job``:
``{"ok": run}`` or ``{"error": sentence, "status": http status}``).

Sent by ``POST /v1/evals/run`` (fermix_gateway/api/evals.py), once per case × agent × model ×
repeat: ``fermix eval`` keeps a bounded number in flight, so a suite spreads over the fleet.
"""

from __future__ import annotations

import json
import logging

from fermix_shared.celery_app import app
from fermix_shared.errors import ConfigError, ProviderError
from fermix_shared.evals.suite import Case
from fermix_shared.task_names import EVAL_TASK
from fermix_worker.evals.run import EvalRequest, run_case
from fermix_worker.runtime import Runtime
from fermix_worker.tasks.recorder import answer_job

log = logging.getLogger(__name__)


@app.task(name=EVAL_TASK, ignore_result=True)
def eval_run(job_id: str, request: str) -> None:
    """Run one case (request: :class:`~fermix_worker.evals.run.EvalRequest`'s fields, the
    case as its suite's JSON)."""
    runtime = Runtime.current()
    try:
        raw = json.loads(request)
        req = EvalRequest(**{**raw, "case": Case.model_validate(raw["case"])})
        run = run_case(req, runtime.settings, runtime.turn_tools, runtime.router, runtime.redis)
        answer_job(job_id, {"ok": run.as_json()})
    except (ValueError, ConfigError, ProviderError) as e:
        answer_job(job_id, {"error": str(e), "status": 422})
    except Exception as e:
        log.exception("the eval job %s failed", job_id)
        answer_job(job_id, {"error": f"the worker failed: {type(e).__name__}: {e}",
                            "status": 500})
