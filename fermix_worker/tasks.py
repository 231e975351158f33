"""Celery tasks: thin shells over Dispatcher. Task names are stable (Flower shows them).

Worker lifecycle hooks start the heartbeat (every ``worker_heartbeat_seconds``; ``fermix
status`` lists workers seen, and the reaper takes a silent process for dead) and the reaper
timer (dead turns and subagents are found without any special process). SIGTERM is a
graceful stop (:mod:`fermix_worker.shutdown`): turns in flight get a grace to finish, the
rest resume on another worker at once.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery import Task
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from fermix_shared import metrics
from fermix_shared.celery_app import (
    APPROVAL_RESUME_TASK,
    DISPATCH_TASK,
    PRIVATE_SEND_TASK,
    SEND_TASK,
    app,
)
from fermix_shared.channels.base import ChannelError, SendsPrivately
from fermix_shared.channels.registry import outbound
from fermix_shared.errors import ConfigError
from fermix_shared.models import ConversationKey
from fermix_shared.redis_client import get_redis
from fermix_shared.settings import get_settings
from fermix_worker import runtime
from fermix_worker.providers import get_router
from fermix_worker.shutdown import GracefulStop, release_held
from fermix_worker.subagents.claim import republish
from fermix_worker.turn.dispatch import Dispatcher
from fermix_worker.turn.heartbeat import Heartbeat
from fermix_worker.turn.reaper import Reaper, ReaperConfig, Recoveries, reap

log = logging.getLogger(__name__)


def kick(conv: str) -> None:
    """Enqueue a dispatch for ``conv``."""
    dispatch.apply_async(args=[conv])


@app.task(name=DISPATCH_TASK, bind=True, acks_late=True, ignore_result=True)
def dispatch(self: Task, conv: str) -> str:
    """Run the conversation's next turn if no other worker holds it."""
    if _stopping is not None:
        # Shutting down: Celery may still hand us a message it fetched after SIGTERM. Start
        # no turn here (it would only be handed over at the grace): another worker takes it.
        kick(conv)
        return "stopping"
    return _dispatcher(runtime.worker_name(self.request.hostname)).dispatch(conv)


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


@app.task(name=PRIVATE_SEND_TASK, ignore_result=True)
def send_private(conv: str, user_id: str, text: str) -> None:
    """Show ``text`` to ``user_id`` alone in a chat (a refused button press). One attempt: a
    refusal that does not show is not worth a retry."""
    key = ConversationKey.parse(conv)
    channel = outbound(key.channel)
    if not isinstance(channel, SendsPrivately):
        return
    try:
        channel.send_private(key, user_id, text)
    except ChannelError as e:
        log.warning("private send to %s failed: %s", key.channel, e)


_heartbeat: Heartbeat | None = None
_reaper: Reaper | None = None
_recoveries: Recoveries | None = None
_stopping: GracefulStop | None = None


def _dispatcher(worker: str) -> Dispatcher:
    return Dispatcher(get_redis(), get_settings(), runtime.turn_runner(), worker, kick)


@worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    global _heartbeat, _reaper, _recoveries
    node = getattr(sender, "hostname", None) or "worker"
    # The name turns record as their holder: the heartbeat must carry the same one.
    name = runtime.worker_name(node)
    _warm_up()
    settings = get_settings()
    if settings.metrics_port is not None:  # per process: give each worker its own port
        metrics.start_metrics_server(settings.metrics_port, settings.metrics_addr)
    r = get_redis()
    config = ReaperConfig.from_settings(settings)
    _heartbeat = Heartbeat(r, name, node, config.liveness.heartbeat_s)
    _heartbeat.start()
    _publish_sandbox(r, node, settings)
    # Recovered turns run here, beside the pool (see Recoveries), at most a pool's worth.
    recoveries = _recoveries = Recoveries(lambda conv: _dispatcher(name).dispatch(conv), kick,
                                          limit=settings.worker_concurrency)
    from fermix_worker.memory_tasks import REVIEW_CONVERSATION_TASK, start_due_reviews

    heartbeat = _heartbeat
    _reaper = Reaper(lambda: reap(
        r, config, recover=recoveries, kick=kick,
        republish=lambda message: republish(app, message),
        may_declare_dead=heartbeat.healthy_for() >= config.liveness.dead_s,
        resume_approval=lambda approval_id: app.send_task(
            APPROVAL_RESUME_TASK, args=[approval_id], ignore_result=True),
        memory_reviews=lambda: start_due_reviews(
            r, lambda conv: app.send_task(REVIEW_CONVERSATION_TASK, args=[conv],
                                          ignore_result=True)),
    ), config.liveness.heartbeat_s)
    _reaper.start()


def _publish_sandbox(r: Any, node: str, settings: Any) -> None:
    """How this worker runs commands, for `fermix doctor` and /v1/status (other hosts)."""
    from fermix_shared.stores import sandbox as sandbox_store
    from fermix_worker.tools.command import sandbox_report

    try:
        sandbox_store.publish(r, node, sandbox_report(settings))
    except Exception:
        log.warning("could not publish this worker's sandbox state", exc_info=True)


@worker_shutting_down.connect
def _on_shutting_down(**_: Any) -> None:
    # SIGTERM (or Ctrl-C): Celery stops consuming and waits for its pool. Start no more
    # recoveries here, and give the turns in flight the grace before handing them over.
    global _stopping
    if _reaper is not None:
        _reaper.stop()
    if _stopping is None:
        _stopping = GracefulStop(get_settings().worker_shutdown_grace, _stopped)
    _stopping.begin()


def _stopped() -> None:
    """Say this process stopped (a heartbeat of 0; no beat follows) and end the leases it
    still holds, dispatching those conversations: another worker resumes them now."""
    if _heartbeat is not None:
        _heartbeat.mark_stopped()
        release_held(get_redis(), _heartbeat.worker, kick)


@worker_shutdown.connect
def _on_shutdown(sender: Any = None, **_: Any) -> None:
    # Celery's pool has finished its tasks (or handed them over at the grace); recovered
    # turns run beside it: let them finish within the grace too (the heartbeat still says we
    # are alive), then say we stopped and end the leases still held, so that whatever is left
    # resumes elsewhere at once.
    log.info("worker pool stopped; stopping")
    if _reaper is not None:
        _reaper.stop()
    grace = get_settings().worker_shutdown_grace
    if _recoveries is not None and not _recoveries.drain(grace + 5):
        log.warning("stopping with %d recovered turn(s) still running", _recoveries.running())
    if _stopping is not None:
        _stopping.end()
    with contextlib.suppress(Exception):
        _stopped()
