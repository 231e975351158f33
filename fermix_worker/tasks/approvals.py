# mypy: disallow-untyped-decorators=False
"""``fermix.approvals.resume``: an approval was answered, expired or cancelled; continue its
parked turn on whichever worker runs this (a thin shell over ``TurnRunner.resume_approval``).

Sent by the gateway after ``/approve``, ``/deny``, a chat button or ``POST /v1/approvals``,
by ``/stop`` (cancelled), and by the reaper (expired, or a decision whose task was lost).
Running it twice is harmless: only the first takes the parked turn back.
"""

from __future__ import annotations

from celery import Task

from fermix_shared.approvals import store as approvals
from fermix_shared.celery_app import app
from fermix_shared.task_names import APPROVAL_RESUME_TASK
from fermix_worker.runtime import Runtime, worker_name
from fermix_worker.turn.outcome import waiting


@app.task(name=APPROVAL_RESUME_TASK, bind=True, acks_late=True, ignore_result=True)
def resume(self: Task, approval_id: str) -> int:
    """Resume the turn waiting on ``approval_id``; returns how many messages wait behind it."""
    runtime = Runtime.current()
    outcome = runtime.turn_runner.resume_approval(approval_id,
                                                  worker_name(self.request.hostname))
    queued = waiting(outcome)
    if queued > 0 and (found := approvals.get(runtime.redis, approval_id)) is not None:
        runtime.kick(found.request.conv)
    return queued
