"""The Celery app: Redis broker and result backend, tuned for long, I/O-bound turns.

Workers run the gevent pool (``fermix worker``): a turn spends nearly all its time waiting on
the model's stream, so one process carries hundreds of turns as greenlets; run one process per
core. Task names are stable strings (``fermix.*``) so Flower and ``send_task`` can rely on them.
The gateway sends tasks by name and never imports the worker package.

:data:`app` (what ``celery -A fermix_shared.celery_app:app`` runs and the task shells register
on) reads the process's settings when Celery first needs its configuration, not at import:
importing this module never reads ``FERMIX_*``. :func:`make_celery` configures an app from
the settings it is given, at once (the gateway, the benchmarks, the tests).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from fermix_shared import logs
from fermix_shared.redis.broker import SENTINEL_TRANSPORT
from fermix_shared.redis.broker import TRANSPORT as BROKER_TRANSPORT
from fermix_shared.redis.sentinel import sentinel_target
from fermix_shared.settings import Settings, get_settings
from fermix_shared.task_names import QUEUE, SCHEDULE_TICK_TASK, SUBAGENT_RUN_TASK

# The worker's task shells, named (the shared package never imports the worker).
TASK_MODULES = (
    "fermix_worker.tasks.turns", "fermix_worker.tasks.memory", "fermix_worker.tasks.subagents",
    "fermix_worker.tasks.schedule", "fermix_worker.tasks.approvals", "fermix_worker.tasks.usage",
    "fermix_worker.tasks.recorder", "fermix_worker.tasks.evals",
)
# Beat sends a scheduler tick this often (s); a tick not started within TICK_EXPIRES_S is dropped.
TICK_SECONDS = 1.0
TICK_EXPIRES_S = 5


def redis_conf(settings: Settings) -> dict[str, Any]:
    """Where the broker, the result backend and RedBeat find Redis: ``settings.redis_url``,
    or through Sentinel (``sentinel://`` for kombu and the backend with the master's name in
    their transport options, ``redis-sentinel://`` with ``redbeat_redis_options`` for
    RedBeat). Anything that builds a Celery app or a broker connection takes these."""
    target = sentinel_target(settings)
    if target is None:
        return {"broker_url": settings.redis_url, "broker_transport": BROKER_TRANSPORT,
                "result_backend": settings.redis_url, "redbeat_redis_url": settings.redis_url}
    url = target.kombu_url()
    return {
        "broker_url": url, "broker_transport": SENTINEL_TRANSPORT,
        "result_backend": url,
        "result_backend_transport_options": target.transport_options(),
        # RedBeat reads everything but the scheme from its options.
        "redbeat_redis_url": "redis-sentinel://",
        "redbeat_redis_options": target.redbeat_options(),
    }


def conf_for(settings: Settings) -> dict[str, Any]:
    """The app's configuration under ``settings``."""
    pool = settings.worker_concurrency + 100
    where = redis_conf(settings)
    target = sentinel_target(settings)
    return dict(
        # kombu's Redis transport (or its Sentinel one), minus a new client object per
        # publish and ack.
        **where,
        broker_connection_retry_on_startup=True,
        # Pools sized to the concurrency: redis-py raises when a pool is full.
        broker_pool_limit=pool,
        broker_transport_options={
            "max_connections": pool,
            "visibility_timeout": settings.broker_visibility_timeout,
            **(target.transport_options() if target else {}),
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
        # One result backend (and its Redis pool) per process. Celery's default keeps one per
        # thread, and under gevent every task greenlet is a thread: each task built a new
        # RedisBackend, its pool and connections (~3 % of a worker's CPU in the profile).
        result_backend_thread_safe=True,
        task_serializer="json",
        accept_content=["json"],
        # Flower shows what it receives as events.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        # Backstop only: our loop enforces its own deadline (soft limits do not work in gevent).
        task_time_limit=int(settings.turn_timeout) + 120 if settings.turn_timeout else None,
        task_annotations={SUBAGENT_RUN_TASK: {
            "time_limit": int(settings.subagent_timeout_seconds) + 120}},
        worker_hijack_root_logger=False,
        # Beat's schedule lives in Redis (RedBeat; its URL is in ``where``): entries added at
        # run time fire once.
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


def _unconfigured() -> Celery:
    app = Celery("fermix", include=list(TASK_MODULES))
    # The worker process's collaborators start and stop with the worker (named, not imported:
    # the shared package never imports the worker).
    app.steps["worker"].add("fermix_worker.bootstep:RuntimeStep")
    return app


def make_celery(settings: Settings) -> Celery:
    """An app configured from ``settings`` now."""
    app = _unconfigured()
    app.conf.update(conf_for(settings))
    return app


# Configured from get_settings() when Celery first reads its configuration (a promise of
# defaults, below anything set on app.conf), so that importing this module reads no settings.
app = _unconfigured()
app.add_defaults(lambda: conf_for(get_settings()))


def _our_log_format(logger: logging.Logger, **_: Any) -> None:
    """Worker and beat: Celery's handlers write our format (FERMIX_LOG_FORMAT), redacted."""
    logs.install(logger.handlers, get_settings())


after_setup_logger.connect(_our_log_format)
after_setup_task_logger.connect(_our_log_format)
