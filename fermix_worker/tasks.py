"""Celery tasks: thin shells over Dispatcher. Task names are stable (Flower shows them).

Worker lifecycle hooks start the heartbeat (``fermix status`` lists workers seen) and the
reaper timer (dead turns are found without any special process).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from celery import Task
from celery.signals import worker_ready, worker_shutdown

from fermix_shared import keys, metrics
from fermix_shared.celery_app import DISPATCH_TASK, SEND_TASK, app
from fermix_shared.channels.base import ChannelError
from fermix_shared.channels.registry import outbound
from fermix_shared.errors import ConfigError
from fermix_shared.models import ConversationKey
from fermix_shared.redis_client import get_redis
from fermix_shared.settings import get_settings
from fermix_worker import runtime
from fermix_worker.providers import get_router
from fermix_worker.turn.dispatch import Dispatcher
from fermix_worker.turn.reaper import Reaper

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


def _warm_up() -> None:
    """Import the SDKs and build the clients now, not inside the first turn (~1.5 s)."""
    settings = get_settings()
    runtime.turn_runner()
    try:
        get_router(settings)
    except ConfigError as e:  # reported by every turn until fixed; the worker still starts
        log.error("provider not usable: %s", e)


@app.task(name=SEND_TASK, bind=True, acks_late=True, ignore_result=True, max_retries=3)
def send(self: Task, conv: str, text: str, delivery_id: str) -> None:
    """Send a gateway-made reply (a command's answer, a notice) into a chat. Idempotent per
    ``delivery_id``, so a retry never sends a chunk twice."""
    key = ConversationKey.parse(conv)
    channel = outbound(key.channel)
    if channel is None:
        return
    try:
        channel.send_text(key, text, delivery_id=delivery_id)
    except ChannelError as e:
        log.warning("send to %s failed (%s); retrying", key.channel, e)
        raise self.retry(countdown=5) from e


_stop = threading.Event()
_reaper: Reaper | None = None


def _heartbeat(name: str) -> None:
    r = get_redis()
    while True:
        try:
            r.hset(keys.workers(), name, f"{time.time():.3f}")
        except Exception:
            log.warning("worker heartbeat failed", exc_info=True)
        if _stop.wait(HEARTBEAT_SECONDS):
            return


@worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    global _reaper
    name = getattr(sender, "hostname", None) or "worker"
    _warm_up()
    settings = get_settings()
    if settings.metrics_port is not None:  # per process: give each worker its own port
        metrics.start_metrics_server(settings.metrics_port, settings.metrics_addr)
    threading.Thread(target=_heartbeat, args=(name,), daemon=True).start()
    lease = settings.lease_seconds
    _reaper = Reaper(get_redis(), kick, interval_s=max(1.0, lease / 3), stale_s=lease)
    _reaper.start()


@worker_shutdown.connect
def _on_shutdown(sender: Any = None, **_: Any) -> None:
    _stop.set()
    if _reaper is not None:
        _reaper.stop()
    with contextlib.suppress(Exception):
        get_redis().hdel(keys.workers(), getattr(sender, "hostname", None) or "worker")
