"""The scheduler's Celery task: a thin shell over :class:`fermix_worker.scheduler.Scheduler`.

Celery beat (RedBeat, one beat fleet-wide) sends it every second (``make_celery``'s
``beat_schedule``); ticks expire after a few seconds so a backlog never replays.
"""

from __future__ import annotations

from fermix_shared.celery_app import SCHEDULE_TICK_TASK, app
from fermix_shared.redis_client import get_redis
from fermix_worker.scheduler import Scheduler
from fermix_worker.tasks import kick


@app.task(name=SCHEDULE_TICK_TASK, acks_late=False, ignore_result=True)
def tick() -> list[str]:
    """Fire every due job occurrence once, fleet-wide; returns the jobs fired."""
    return Scheduler(get_redis(), kick).tick()
