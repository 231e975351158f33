# mypy: disallow-untyped-decorators=False
"""Celery tasks of the ``subagents`` fan-out: thin shells over SubagentRunner and TurnRunner.

``fermix.subagents.run`` is a chord header task: it runs one subagent, or, when the fan-out's
concurrency slots are all taken, re-schedules itself a moment later instead of holding its
worker slot (Celery forbids waiting on other tasks). It catches everything and returns a
report, so one broken subagent never fails the chord. ``fermix.subagents.resume`` is the
chord callback: it merges the reports and resumes the parked turn on whichever worker runs it.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

from celery import Task
from celery.exceptions import Retry

from fermix_shared.celery_app import SUBAGENT_RESUME_TASK, SUBAGENT_RUN_TASK, app
from fermix_shared.hooks import get_hooks
from fermix_shared.redis_client import get_redis
from fermix_shared.settings import get_settings
from fermix_shared.stores.events import RunEvents
from fermix_worker import runtime
from fermix_worker.subagents import results
from fermix_worker.subagents.fanout import FanOutMeta
from fermix_worker.subagents.runner import NoSlot, SubagentJob, SubagentRunner, crash_report
from fermix_worker.tasks import kick
from fermix_worker.tools import BUILTIN_TOOLS
from fermix_worker.turn.outcome import waiting

log = logging.getLogger(__name__)

# How soon a header task that found every slot taken looks again (jittered). Short, so a
# freed slot is taken quickly; each look is one cheap task run, never a blocked worker.
SLOT_RETRY_SECONDS = 0.5

_lock = threading.Lock()
_runner: SubagentRunner | None = None


def subagent_runner() -> SubagentRunner:
    global _runner
    if _runner is None:
        with _lock:
            if _runner is None:
                _runner = SubagentRunner(get_redis(), get_settings(), BUILTIN_TOOLS,
                                         get_hooks())
    return _runner


@app.task(name=SUBAGENT_RUN_TASK, bind=True, acks_late=True, ignore_result=False,
          max_retries=None, time_limit=int(get_settings().subagent_timeout_seconds) + 120)
def run(self: Task, raw: dict[str, Any]) -> dict[str, Any]:
    """Run one subagent; its report is this task's result (the chord collects them)."""
    worker = runtime.worker_name(self.request.hostname)
    try:
        outcome = subagent_runner().run(SubagentJob.model_validate(raw), worker)
        if isinstance(outcome, NoSlot):
            raise self.retry(countdown=SLOT_RETRY_SECONDS * random.uniform(0.8, 1.2))
        return outcome.model_dump(mode="json")
    except Retry:
        raise
    except Exception as e:  # a failed header task would fail the whole chord
        log.exception("subagent task crashed")
        return crash_report(raw, e, worker).model_dump(mode="json")


@app.task(name=SUBAGENT_RESUME_TASK, bind=True, acks_late=True, ignore_result=True)
def resume(self: Task, reports: list[Any], raw_meta: dict[str, Any]) -> int:
    """Merge the subagents' reports and continue the parked turn with them."""
    meta = FanOutMeta.model_validate(raw_meta)
    r = get_redis()
    if meta.refused:
        result = results.refused(meta.refused)
    else:
        merged = results.normalize(reports, meta.tasks)
        result = results.merge(meta.tasks, merged, meta.result_bytes)
        RunEvents(r, meta.run_id).emit(
            "diagnostic", kind="subagents", phase="end", callId=meta.call_id,
            counts=results.counts(merged),
            tasks=[{"index": m.index, "status": m.status, "startedAt": m.started_at,
                    "endedAt": m.ended_at, "worker": m.worker} for m in merged],
        )
    outcome = runtime.turn_runner().resume_fanout(
        meta.conv, meta.run_id, meta.call_id, result, runtime.worker_name(self.request.hostname)
    )
    if (queued := waiting(outcome)) > 0:
        kick(meta.conv)
    return queued
