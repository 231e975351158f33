# mypy: disallow-untyped-decorators=False
"""``fermix.recorder.replay`` and ``fermix.recorder.fork``: replay a recorded run, or fork it,
on whichever worker takes the task (it has today's code, configuration and tools), and hand
the report back to the gateway that waits for it (``keys.recorder_job``: one JSON value,
``{"ok": report}`` or ``{"error": sentence, "status": http status}``).

Sent by ``POST /v1/runs/{id}/replay`` and ``/fork`` (fermix_gateway/api/recorder.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fermix_shared import keys
from fermix_shared import recorder as rec
from fermix_shared.celery_app import app
from fermix_shared.errors import ConfigError, ProviderError
from fermix_shared.logs import RedactSecrets, secret_values
from fermix_shared.task_names import FORK_TASK, REPLAY_TASK
from fermix_worker.recorder.fork import ForkError, ForkOptions, fork
from fermix_worker.recorder.replay import replay
from fermix_worker.runtime import Runtime

log = logging.getLogger(__name__)


def answer_job(job_id: str, body: dict[str, Any]) -> None:
    """Hand ``body`` to the gateway waiting on ``job_id`` (kept 10 minutes for a late reader)."""
    r = Runtime.current().redis
    key = keys.recorder_job(job_id)
    with r.pipeline(transaction=False) as pipe:
        pipe.rpush(key, json.dumps(body))
        pipe.expire(key, keys.RECORDER_JOB_TTL_SECONDS)
        pipe.execute()


def _run(job_id: str, run_id: str, work: Callable[[rec.Recording], dict[str, Any]]) -> None:
    runtime = Runtime.current()
    recording = rec.read(runtime.redis, run_id)
    if recording is None:
        answer_job(job_id, {"error": f"run {run_id} has no record (the recorder keeps runs for "
                                  f"{runtime.settings.recorder.keep_days:g} days)",
                         "status": 404})
        return
    try:
        answer_job(job_id, {"ok": work(recording)})
    except (ForkError, ValueError, ConfigError, ProviderError) as e:
        answer_job(job_id, {"error": str(e), "status": 422})
    except Exception as e:
        log.exception("the recorder job %s on run %s failed", job_id, run_id)
        answer_job(job_id, {"error": f"the worker failed: {type(e).__name__}: {e}", "status": 500})


@app.task(name=REPLAY_TASK, ignore_result=True)
def replay_run(job_id: str, run_id: str, options: str) -> None:
    """Replay ``run_id`` (options: ``{"step": N}``)."""
    runtime = Runtime.current()
    step = json.loads(options).get("step")
    mask = RedactSecrets(secret_values(runtime.settings)).redact
    _run(job_id, run_id, lambda recording: replay(
        recording, runtime.settings, runtime.turn_tools, step=step, mask=mask).as_json())


@app.task(name=FORK_TASK, ignore_result=True)
def fork_run(job_id: str, run_id: str, options: str) -> None:
    """Fork ``run_id`` (options: :class:`~fermix_worker.recorder.fork.ForkOptions`' fields)."""
    runtime = Runtime.current()
    opts = ForkOptions(**json.loads(options))
    _run(job_id, run_id, lambda recording: fork(
        recording, runtime.settings, runtime.turn_tools, runtime.router, runtime.redis,
        opts).as_json())
