"""A job occurrence becomes a run: one isolated conversation, queued like any message.

The run's conversation is ``schedule|<job name>|<run id>``, so runs never share history or
queue behind each other. A scheduled occurrence's run id is derived from the job and the
occurrence, and it is accepted under the occurrence as its de-duplication id: however many
schedulers try to fire one occurrence, one run is queued (``accept`` is atomic).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import redis

from fermix_shared import tracing
from fermix_shared.models import ConversationKey, InboundMessage, new_run_id
from fermix_shared.scheduling.jobs import Job
from fermix_shared.stores import queue
from fermix_shared.stores.queue import AcceptCode, Accepted

log = logging.getLogger(__name__)

_RUN_NAMESPACE = uuid.UUID("6f3c2a58-0c7e-4a4e-9a57-5c1d1b1f0c11")


def occurrence_run_id(job: Job, occurrence_ms: int) -> str:
    """The one run id of a job's occurrence (a re-created job with the same name differs)."""
    seed = f"{job.name}:{job.created_at}:{occurrence_ms}"
    return "run_" + uuid.uuid5(_RUN_NAMESPACE, seed).hex


def run_message(job: Job, run_id: str, scheduled_for: int | None) -> InboundMessage:
    """The message a run of ``job`` starts with: the job's prompt, for the job's agent, at
    its creator's trust with the job's tool subset (the agent narrows both further)."""
    return InboundMessage(
        run_id=run_id,
        key=ConversationKey(channel="schedule", chat_id=job.name, thread_scope=run_id),
        text=job.message,
        sender_id=f"schedule:{job.name}",
        trust=job.trust,
        context="scheduled",
        deliver_to=job.delivery.to,
        allowed_tools=job.allowed_tools,
        job=job.name,
        agent=job.agent,
        timeout_s=job.timeout_s,
        scheduled_for=scheduled_for,
    )


def enqueue_run(
    r: redis.Redis, job: Job, kick: Callable[[str], None], *, scheduled_for: int | None
) -> Accepted:
    """Queue a run of ``job`` for the occurrence ``scheduled_for`` (None: a manual run, always
    a new one) and kick its dispatch. A second call for one occurrence is a ``duplicate``."""
    if scheduled_for is None:
        msg = run_message(job, new_run_id(), None)
        message_id = None
    else:
        msg = run_message(job, occurrence_run_id(job, scheduled_for), scheduled_for)
        message_id = f"occurrence:{scheduled_for}"
    # The run's trace starts here, as a message's does at the gateway (fermix_shared/tracing.py).
    with tracing.span("fermix.accept", {"fermix.run_id": msg.run_id, "fermix.job": job.name,
                                        "fermix.channel": "schedule", "fermix.agent": msg.agent},
                      kind=tracing.SpanKind.PRODUCER) as span:
        msg.trace = tracing.inject()
        accepted = queue.accept(r, msg, message_id=message_id)
        span.set_attribute("fermix.accept.outcome", accepted.code.name)
    if accepted.code is AcceptCode.queued:
        try:
            kick(msg.key.as_str())
        except Exception:  # the run is durable in its inbox; the reaper dispatches it
            log.exception("could not enqueue the dispatch of scheduled run %s", msg.run_id)
    return accepted


def kick_dispatch(conv: str) -> None:
    """Send a dispatch task for ``conv`` by name (for callers outside a worker: the CLI)."""
    from fermix_shared.celery_app import app
    from fermix_shared.task_names import DISPATCH_TASK

    app.send_task(DISPATCH_TASK, args=[conv], ignore_result=True)
