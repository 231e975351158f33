# mypy: disallow-untyped-decorators=False
"""The scheduler's Celery task: a thin shell over :class:`fermix_worker.scheduling.ticker.Ticker`.

Celery beat (RedBeat, one beat fleet-wide) sends it every second (``make_celery``'s
``beat_schedule``); ticks expire after a few seconds so a backlog never replays.
"""

from __future__ import annotations

from fermix_shared.celery_app import app
from fermix_shared.task_names import SCHEDULE_TICK_TASK
from fermix_worker.runtime import Runtime
from fermix_worker.scheduling.ticker import Ticker


@app.task(name=SCHEDULE_TICK_TASK, acks_late=False, ignore_result=True)
def tick() -> list[str]:
    """Fire every due job occurrence once, fleet-wide; returns the jobs fired."""
    runtime = Runtime.current()
    return Ticker(runtime.redis, runtime.kick).tick()
