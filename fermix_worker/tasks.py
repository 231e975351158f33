"""Celery tasks: thin shells over Dispatcher. Task names are stable (Flower shows them)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from celery import Task
from celery.signals import worker_ready, worker_shutdown

from fermix_shared import keys
from fermix_shared.celery_app import DISPATCH_TASK, app
from fermix_shared.redis_client import get_redis
from fermix_shared.settings import get_settings
from fermix_worker import runtime
from fermix_worker.dispatch import Dispatcher

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0


def kick(conv: str) -> None:
    """Enqueue a dispatch for ``conv``."""
    dispatch.apply_async(args=[conv])


@app.task(name=DISPATCH_TASK, bind=True, acks_late=True, ignore_result=True)
def dispatch(self: Task, conv: str) -> str:
    """Run the conversation's next turn if no other worker holds it."""
    d = Dispatcher(
        get_redis(),
        get_settings(),
        runtime.turn_runner(),
        runtime.worker_name(self.request.hostname),
        kick,
    )
    return d.dispatch(conv)


_heartbeat_stop = threading.Event()


def _heartbeat(name: str) -> None:
    r = get_redis()
    while True:
        try:
            r.hset(keys.workers(), name, f"{time.time():.3f}")
        except Exception:
            log.warning("worker heartbeat failed", exc_info=True)
        if _heartbeat_stop.wait(HEARTBEAT_SECONDS):
            return


@worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None)
    threading.Thread(target=_heartbeat, args=(name or "worker",), daemon=True).start()


@worker_shutdown.connect
def _on_shutdown(sender: Any = None, **_: Any) -> None:
    _heartbeat_stop.set()
    with contextlib.suppress(Exception):
        get_redis().hdel(keys.workers(), getattr(sender, "hostname", None) or "worker")
