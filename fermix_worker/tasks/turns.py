# mypy: disallow-untyped-decorators=False
"""The conversation's Celery tasks: thin shells over the Dispatcher and the channels.

``fermix.conversation.dispatch`` runs a conversation's next turn if no other worker holds it;
``fermix.channel.send`` and ``fermix.channel.send_private`` put a gateway-made message into a
chat. Task names are stable (:mod:`fermix_shared.task_names`; Flower shows them).
"""

from __future__ import annotations

import logging

from celery import Task

from fermix_shared.celery_app import app
from fermix_shared.channels.base import ChannelError, SendsPrivately
from fermix_shared.channels.registry import outbound
from fermix_shared.models import ConversationKey
from fermix_shared.task_names import DISPATCH_TASK, PRIVATE_SEND_TASK, SEND_TASK
from fermix_worker.runtime import Runtime, worker_name

log = logging.getLogger(__name__)


@app.task(name=DISPATCH_TASK, bind=True, acks_late=True, ignore_result=True)
def dispatch(self: Task, conv: str) -> str:
    """Run the conversation's next turn if no other worker holds it."""
    runtime = Runtime.current()
    if runtime.stopping is not None:
        # Shutting down: Celery may still hand us a message it fetched after SIGTERM. Start
        # no turn here (it would only be handed over at the grace): another worker takes it.
        runtime.kick(conv)
        return "stopping"
    return runtime.dispatcher(worker_name(self.request.hostname)).dispatch(conv)


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
