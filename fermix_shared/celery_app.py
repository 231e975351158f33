"""The Celery app: Redis broker and result backend, tuned for long, I/O-bound turns.

Workers run the gevent pool (``fermix worker``): a turn spends nearly all its time waiting on
the model's stream, so one process carries hundreds of turns as greenlets; run one process per
core. Task names are stable strings (``fermix.*``) so Flower and ``send_task`` can rely on them.
The gateway sends tasks by name and never imports the worker package.
"""

from __future__ import annotations

from celery import Celery

from fermix_shared.settings import Settings, get_settings

DISPATCH_TASK = "fermix.conversation.dispatch"
SEND_TASK = "fermix.channel.send"
QUEUE = "fermix.turns"


def make_celery(settings: Settings) -> Celery:
    pool = settings.worker_concurrency + 100
    app = Celery("fermix", include=["fermix_worker.tasks"])
    app.conf.update(
        broker_url=settings.redis_url,
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
        task_time_limit=int(settings.turn_timeout) + 120,
        worker_hijack_root_logger=False,
        # Beat's schedule lives in Redis (RedBeat): entries added at run time fire once.
        redbeat_redis_url=settings.redis_url,
    )
    return app


app = make_celery(get_settings())
