"""The floor the turn benchmarks are measured against: a trivial Celery task on Redis.

``floor.echo`` returns its argument. It runs on the same Celery, kombu, gevent and Redis as a
turn, with the broker settings that matter to latency the way Fermix sets them (prefetch 1,
late acks), and its result comes back through the Redis result backend: the least a Celery
round trip on this machine costs (benchmarks/floor.py). The broker is ``FLOOR_REDIS_URL``.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("floor", broker=os.environ.get("FLOOR_REDIS_URL", "redis://127.0.0.1:6379/15"),
             backend=os.environ.get("FLOOR_REDIS_URL", "redis://127.0.0.1:6379/15"))
app.conf.update(worker_prefetch_multiplier=1, task_acks_late=True, result_expires=600,
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)


@app.task(name="floor.echo")
def echo(x: int) -> int:
    return x
