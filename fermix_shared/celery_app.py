"""The Celery app: Redis broker and result backend, tuned for long, I/O-bound turns.

Workers run the gevent pool (``fermix worker``): a turn spends nearly all its time waiting on
the model's stream, so one process carries hundreds of turns as greenlets; run one process per
core. Task names are stable strings (``fermix.*``) so Flower and ``send_task`` can rely on them.
The gateway sends tasks by name and never imports the worker package.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from fermix_shared import logs
from fermix_shared.broker import TRANSPORT as BROKER_TRANSPORT
from fermix_shared.settings import Settings, get_settings

DISPATCH_TASK = "fermix.conversation.dispatch"
SEND_TASK = "fermix.channel.send"
SUBAGENT_RUN_TASK = "fermix.subagents.run"
SUBAGENT_RESUME_TASK = "fermix.subagents.resume"
# An approval was answered: continue its parked turn (args: [approval_id]).
APPROVAL_RESUME_TASK = "fermix.approvals.resume"
QUEUE = "fermix.turns"
SCHEDULE_TICK_TASK = "fermix.schedule.tick"
# Beat sends a scheduler tick this often (s); a tick not started within TICK_EXPIRES_S is dropped.
TICK_SECONDS = 1.0
TICK_EXPIRES_S = 5


def make_celery(settings: Settings) -> Celery:
    pool = settings.worker_concurrency + 100
    app = Celery("fermix", include=[
        "fermix_worker.tasks", "fermix_worker.memory_tasks", "fermix_worker.subagent_tasks",
        "fermix_worker.scheduling_tasks", "fermix_worker.approval_tasks",
    ])
    app.conf.update(
        broker_url=settings.redis_url,
        # kombu's Redis transport, minus a new client object per publish and ack.
        broker_transport=BROKER_TRANSPORT,
        result_backend=settings.redis_url,
        broker_connection_retry_on_startup=True,
        # Pools sized to the concurrency: redis-py raises when a pool is full.
        broker_pool_limit=pool,
        broker_transport_options={
            "max_connections": pool,
            "visibility_timeout": settings.broker_visibility_timeout,
        },
        redis_max_connections=pool,
        # One message per slot, acknowledged after the task ran: a dead worker's message is
        # redelivered, and the conversation's lease (not the broker) decides who runs a turn.
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        task_default_queue=QUEUE,
        task_ignore_result=True,
        result_expires=3600,
        task_serializer="json",
        accept_content=["json"],
        # Flower shows what it receives as events.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        # Backstop only: our loop enforces its own deadline (soft limits do not work in gevent).
        task_time_limit=int(settings.turn_timeout) + 120 if settings.turn_timeout else None,
        worker_hijack_root_logger=False,
        # Beat's schedule lives in Redis (RedBeat): entries added at run time fire once.
        redbeat_redis_url=settings.redis_url,
        # Scheduled jobs live in our own store (per-job IANA zones across DST); beat only
        # ticks the scheduler. One beat holds RedBeat's lock; a standby polls for it every
        # beat_max_loop_interval and takes over within redbeat_lock_timeout of a crash.
        beat_schedule={"fermix-schedule-tick": {
            "task": SCHEDULE_TICK_TASK, "schedule": TICK_SECONDS,
            "options": {"expires": TICK_EXPIRES_S},
        }},
        beat_max_loop_interval=1,
        redbeat_lock_timeout=10,
    )
    return app


app = make_celery(get_settings())


def _our_log_format(logger: logging.Logger, **_: Any) -> None:
    """Worker and beat: Celery's handlers write our format (FERMIX_LOG_FORMAT), redacted."""
    logs.install(logger.handlers, get_settings())


after_setup_logger.connect(_our_log_format)
after_setup_task_logger.connect(_our_log_format)
