# mypy: disallow-untyped-decorators=False
"""Celery tasks of the ``subagents`` fan-out: thin shells over SubagentRunner and TurnRunner.

``fermix.subagents.run`` is a chord header task: it runs one subagent, or, when the fan-out's
concurrency slots are all taken, re-schedules itself a moment later instead of holding its
worker slot (Celery forbids waiting on other tasks). It catches everything and returns a
report, so one broken subagent never fails the chord. It claims its subagent in Redis first
(``subagents/claim.py``): when its worker dies, the reaper publishes it again under the same
task id within seconds, not the broker after its visibility timeout.
``fermix.subagents.resume`` is the chord callback: it merges the reports (or, for a
``skill_run`` call, turns its one report into the skill's answer) and resumes the parked turn
on whichever worker runs it. Each execution of a header task is a span (``fermix.subagent``),
child of the fan-out's span in the parent turn's trace, which the job carries.
"""

from __future__ import annotations

import logging
import random
from contextlib import AbstractContextManager
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Retry
from celery.signals import task_success
from opentelemetry.trace import Span

from fermix_shared import tracing
from fermix_shared.celery_app import app
from fermix_shared.run_events import SubagentsEnded
from fermix_shared.stores.events import RunEvents
from fermix_shared.task_names import SUBAGENT_RESUME_TASK, SUBAGENT_RUN_TASK
from fermix_worker.fleet.heartbeat import Liveness
from fermix_worker.runtime import Runtime, worker_name
from fermix_worker.subagents import results
from fermix_worker.subagents.claim import (
    Busy,
    RerunMessage,
    SubagentClaim,
    Superseded,
    counted,
)
from fermix_worker.subagents.fanout import FanOutMeta
from fermix_worker.subagents.park import Parked
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.runner import NoSlot, SubagentJob, crash_report
from fermix_worker.subagents.skill_run import skill_result
from fermix_worker.turn.outcome import waiting

log = logging.getLogger(__name__)

# How soon a header task that found every slot taken looks again (jittered). Short, so a
# freed slot is taken quickly; each look is one cheap task run, never a blocked worker.
SLOT_RETRY_SECONDS = 0.5

def _claim(request: Any, job: SubagentJob, raw: dict[str, Any], worker: str,
           park_token: str | None) -> SubagentClaim:
    """This execution's claim on its subagent, with what re-running the task would take
    (``park_token``: this execution is the retry of that park)."""
    message = RerunMessage(
        task_id=request.id, group_id=request.group, group_index=request.group_index,
        chord=dict(request.chord) if request.chord else None, root_id=request.root_id,
        parent_id=request.parent_id, job=raw,
    )
    runtime = Runtime.current()
    return SubagentClaim(runtime.redis, job.fanout_id, job.index, worker, message,
                         dead_ms=Liveness.from_settings(runtime.settings).dead_ms,
                         ttl_s=job.slots_ttl_s, park_token=park_token)


# Its time limit is the app's (make_celery's task_annotations: the subagent timeout + 120 s).
@app.task(name=SUBAGENT_RUN_TASK, bind=True, acks_late=True, ignore_result=False,
          max_retries=None)
def run(self: Task, raw: dict[str, Any], park_token: str | None = None) -> dict[str, Any]:
    """Run one subagent; its report is this task's result (the chord collects them).

    A duplicate execution (the subagent runs on a live worker, or an execution that was taken
    for dead lost it to a re-run) reports nothing: ``Ignore`` leaves the chord untouched. A
    subagent parked for an approval retries with its park's token (``park_token``) until the
    answer came and it went on (subagents/park.py)."""
    worker = worker_name(self.request.hostname)
    try:
        job = SubagentJob.model_validate(raw)
        claim = _claim(self.request, job, raw, worker, park_token)
        with _span(job, worker) as span:
            ran = Runtime.current().subagent_runner.run(job, worker, claim)
            span.set_attribute("fermix.subagent.outcome", ran.status if isinstance(
                ran, SubagentReport) else type(ran).__name__)
        match ran:
            case NoSlot():
                raise self.retry(kwargs={}, countdown=SLOT_RETRY_SECONDS * random.uniform(0.8, 1.2))
            case Parked(park_token=token, retry_s=seconds):
                raise self.retry(kwargs={"park_token": token},
                                 countdown=seconds * random.uniform(0.8, 1.2))
            case Busy() | Superseded() as other:
                log.info("subagent %s of %s: %s, not reporting", job.index, job.parent_run,
                         type(other).__name__)
                raise Ignore()
            case SubagentReport() as report:
                return report.model_dump(mode="json")
    except (Retry, Ignore):
        raise
    except Exception as e:  # a failed header task would fail the whole chord
        log.exception("subagent task crashed")
        return crash_report(raw, e, worker).model_dump(mode="json")


def _span(job: SubagentJob, worker: str) -> AbstractContextManager[Span]:
    """One execution's span, child of its fan-out's (the parent turn's trace)."""
    return tracing.span_from(job.trace, "fermix.subagent", {
        "fermix.run_id": job.parent_run, "fermix.conversation": job.conv,
        "fermix.fanout_id": job.fanout_id, "fermix.subagent.index": job.index,
        "fermix.worker": worker, "gen_ai.agent.name": job.skill or "subagent",
    }, kind=tracing.SpanKind.CONSUMER)


@task_success.connect
def _counted(sender: Any = None, **_: Any) -> None:
    """After a header task's result is stored (the chord counted it): stop watching it."""
    if getattr(sender, "name", None) != SUBAGENT_RUN_TASK:
        return
    args = sender.request.args or []
    raw = args[0] if args else None
    if isinstance(raw, dict) and isinstance(raw.get("fanout_id"), str) and isinstance(
            raw.get("index"), int):
        try:
            counted(Runtime.current().redis, raw["fanout_id"], raw["index"])
        except Exception:  # the reaper re-sends the stored report: counted once anyway
            log.warning("could not mark subagent %s as counted", raw["index"], exc_info=True)


@app.task(name=SUBAGENT_RESUME_TASK, bind=True, acks_late=True, ignore_result=True)
def resume(self: Task, reports: list[Any], raw_meta: dict[str, Any]) -> int:
    """Merge the subagents' reports and continue the parked turn with them."""
    meta = FanOutMeta.model_validate(raw_meta)
    runtime = Runtime.current()
    r = runtime.redis
    if meta.refused:
        result = results.refused(meta.refused)
    elif meta.skill:
        (report,) = results.normalize(reports, meta.tasks)
        result = skill_result(meta.skill, report, meta.result_bytes, meta.fenced)
    else:
        merged = results.normalize(reports, meta.tasks)
        result = results.merge(meta.tasks, merged, meta.result_bytes)
        RunEvents(r, meta.run_id).emit(SubagentsEnded(
            call_id=meta.call_id, counts=results.counts(merged),
            tasks=[{"index": m.index, "status": m.status, "startedAt": m.started_at,
                    "endedAt": m.ended_at, "worker": m.worker} for m in merged],
        ))
    outcome = runtime.turn_runner.resume_fanout(
        meta.conv, meta.run_id, meta.call_id, result, worker_name(self.request.hostname),
        tool_name=meta.tool,
    )
    if (queued := waiting(outcome)) > 0:
        runtime.kick(meta.conv)
    return queued
