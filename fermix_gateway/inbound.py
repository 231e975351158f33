"""Inbound handling shared by the run API and the chat webhooks: trust, commands, queueing.

``receive`` is the webhooks' entry: it drops unknown senders, answers commands at once (the
reply goes out through a worker's channel adapter, so the webhook answers fast), and queues
everything else durably (de-duplicated by the platform's delivery id) before returning.

Limits (``settings.limits``): a message longer than ``max_text_chars`` is refused and the
sender told why in the chat; a message over the conversation's queue cap or the sender's rate
is dropped and logged, with no reply (a flood must not turn into a flood of our own sends, and
the platform gets its 200, so it does not redeliver). Slack slash commands answer in the HTTP
response, so they carry the reason either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, assert_never

import redis.asyncio as aioredis
from fastapi import Request

from fermix_gateway import commands
from fermix_gateway.approval_answers import SendTask
from fermix_gateway.auth import trust_of
from fermix_shared import audit, logs, metrics, tracing
from fermix_shared.agents.definitions import bound_agent
from fermix_shared.channels.base import InboundEvent
from fermix_shared.channels.modes import queue_mode_for
from fermix_shared.models import ConversationKey, InboundMessage, RunProfile, Trust
from fermix_shared.redis import durability
from fermix_shared.settings import Settings
from fermix_shared.stores import queue
from fermix_shared.stores.queue import AcceptCode, Accepted, AcceptLimits
from fermix_shared.task_names import DISPATCH_TASK, SEND_TASK

log = logging.getLogger(__name__)

# Outcomes whose message is (or already was) stored: the ones a replica must have.
_WRITTEN = (AcceptCode.queued, AcceptCode.steered, AcceptCode.duplicate)

BUSY_NOTICE = "I'm still working on your previous message; send this again when I've answered."
TOO_LONG_NOTICE = ("That message is too long for me: {length:,} characters, and I take at most "
                   "{limit:,}. Please shorten it or send it in parts.")
FULL_NOTICE = ("{limit} messages are already waiting in this conversation; send this again "
               "once I've caught up.")
RATE_NOTICE = ("You're sending messages faster than I take them (at most {limit} a minute); "
               "try again in {seconds} s.")


@dataclass(frozen=True)
class ReceiveResult:
    """What became of an inbound event."""

    kind: Literal["dropped", "duplicate", "command", "queued", "steered", "refused", "too_long",
                  "full", "rate_limited"]
    run_id: str | None = None
    reply: str | None = None


def accept_limits(settings: Settings, sender: str) -> AcceptLimits:
    """The queue cap and the rate of ``sender`` (``channel:user``) from the settings."""
    return AcceptLimits(sender=sender,
                        max_queued=settings.limits.max_queued_per_conversation,
                        per_minute=settings.limits.sender_messages_per_minute)


def retry_after_seconds(accepted: Accepted) -> int:
    """Whole seconds until a rate-limited sender may send again (at least 1)."""
    return max(1, -(-accepted.retry_after_ms // 1000))


def refusal_notice(settings: Settings, accepted: Accepted) -> str:
    """What a ``full`` or ``rate_limited`` refusal says to the sender."""
    if accepted.code is AcceptCode.full:
        return FULL_NOTICE.format(limit=settings.limits.max_queued_per_conversation)
    return RATE_NOTICE.format(limit=settings.limits.sender_messages_per_minute,
                              seconds=retry_after_seconds(accepted))


def task_sender(request: Request) -> SendTask:
    """Sends a Celery task by name from this request's app, without waiting for the broker
    (see :mod:`fermix_gateway.publisher`: what it would start is durable)."""
    return lambda name, args: _send_task(request, name, args)


async def _send_task(request: Request, name: str, args: list[str]) -> None:
    request.app.state.tasks.send(name, args)


async def enqueue(
    request: Request, msg: InboundMessage, *, message_id: str | None,
    limits: AcceptLimits | None = None,
) -> Accepted:
    """Queue ``msg`` in its conversation under the conversation's queue mode, durably, then
    kick a dispatch. ``interrupt`` stops the running turn first, inside the accept script:
    only a message that is queued stops anything (a duplicate or a refusal never does).
    ``limits`` may refuse it (``full``, ``rate_limited``): nothing is queued then. Raises
    :class:`~fermix_shared.redis.durability.NotReplicated` (a 503) when fewer replicas than the
    ``FERMIX_REDIS_WAIT_REPLICAS`` rule asks acknowledged the stored message.

    With tracing on, the accept is its turn's root span (a child of the caller's span when the
    request carries a W3C ``traceparent``: an instrumented API client's trace goes on into the
    turn), and the message carries its context to the worker (``msg.trace``)."""
    with tracing.span_from(tracing.carried(request.headers), "fermix.accept", {
        "fermix.run_id": msg.run_id, "fermix.conversation": msg.key.as_str(),
        "fermix.channel": msg.key.channel, "fermix.agent": msg.agent, "fermix.kind": msg.kind,
    }, kind=tracing.SpanKind.SERVER) as span:
        msg.trace = tracing.inject()
        accepted = await _enqueue(request, msg, message_id=message_id, limits=limits)
        span.set_attribute("fermix.accept.outcome", accepted.code.name)
        if accepted.run_id and accepted.run_id != msg.run_id:  # a duplicate: the first's run
            span.set_attribute("fermix.run_id", accepted.run_id)
        return accepted


async def _enqueue(
    request: Request, msg: InboundMessage, *, message_id: str | None,
    limits: AcceptLimits | None,
) -> Accepted:
    r, settings = request.app.state.redis, request.app.state.settings
    conv = msg.key.as_str()
    mode = queue_mode_for(settings, msg.key.channel, await queue.queue_mode_async(r, conv))
    if msg.kind != "message":
        mode = "followup"  # a job for the conversation waits its turn, whatever the mode
    # Durable means on a replica too (FERMIX_REDIS_WAIT_REPLICAS): WAIT on the connection
    # that wrote. A shortfall is answered 503 below, after the kick (the message is queued on
    # the primary and normally runs; the platform's retry is then a duplicate).
    # Under ``auto``, no WAIT while the primary has no replica (fermix_shared/redis/replicas.py).
    waiter: durability.AcceptWait = request.app.state.accept_wait
    replicas = await waiter.wanted(r)
    async with durability.write_session(r, replicas) as conn:
        accepted = await queue.accept_async(conn, msg, mode=mode, message_id=message_id,
                                            limits=limits)
        short = (await waiter.settle(conn, replicas) if accepted.code in _WRITTEN else None)
    if accepted.interrupted is not None:
        await commands.after_stop(r, msg.key, accepted.interrupted, task_sender(request),
                                  "interrupt")
    # This request's later log lines (uvicorn's access line too) name the run it accepted.
    logs.bind(run_id=accepted.run_id, conversation=conv)
    if accepted.new:
        metrics.count_run_accepted(msg.key.channel)
        await request.app.state.hooks.acall("message_received", {
            "run_id": accepted.run_id, "channel": msg.key.channel, "chatId": msg.key.chat_id,
            "threadScope": msg.key.thread_scope, "text": msg.text,
        })
    if accepted.code is AcceptCode.queued:
        await _send_task(request, DISPATCH_TASK, [conv])
    if short is not None:
        log.warning("answering 503 for %s's message %s: %s", conv, accepted.run_id, short)
        raise short
    return accepted


async def reply_in_chat(request: Request, key: ConversationKey, text: str, delivery_id: str) -> None:
    """Send ``text`` into a chat through a worker (the gateway never calls platforms inline)."""
    await _send_task(request, SEND_TASK, [key.as_str(), text, delivery_id])


async def audit_trust(r: aioredis.Redis, key: ConversationKey, sender: str, trust: Trust | None,
                      text: str, agent: str = "") -> None:
    """The audit entry of one trust decision on an inbound message: ``pass`` with the trust
    given, or ``fail`` for a stranger (dropped), counted per sender and hour rather than
    each appended (:mod:`fermix_shared.audit.refusals`). The text is kept as its digest and
    length."""
    digest = audit.text_digest(text)
    if trust is None:
        await audit.arecord_refusal(r, "trust", "inbound", actor=sender, conv=key.as_str(),
                                    trust="stranger", text_sha256=digest, text_len=len(text))
        return
    await audit.arecord(r, "trust", "inbound", "pass", actor=sender, conv=key.as_str(),
                        agent=agent, trust=trust, text_sha256=digest, text_len=len(text))


async def receive(request: Request, event: InboundEvent) -> ReceiveResult:
    """Handle one platform message (see the module docstring)."""
    r, settings = request.app.state.redis, request.app.state.settings
    channel = event.key.channel
    trust = trust_of(settings, channel, event.sender_id)
    await audit_trust(r, event.key, f"{channel}:{event.sender_id}", trust, event.text,
                      bound_agent(settings.bindings, event.key) if trust else "")
    if trust is None:
        log.warning("dropped a %s message from %s:%s, who is neither owner nor allowed",
                    channel, channel, event.sender_id)
        return ReceiveResult("dropped")
    limit = settings.limits.max_text_chars
    if len(event.text) > limit:
        log.warning("refused a %s message of %d characters from %s:%s (limit %d)",
                    channel, len(event.text), channel, event.sender_id, limit)
        notice = TOO_LONG_NOTICE.format(length=len(event.text), limit=limit)
        if not event.answers_inline:
            delivery = f"toolong:{channel}:{event.dedupe_id}"
            await reply_in_chat(request, event.key, notice, delivery)
        return ReceiveResult("too_long", reply=notice)
    text = event.text
    profile: RunProfile = "default"
    if cmd := commands.parse_command(event.text, event.bot_name):
        if not await queue.first_delivery_async(r, f"{channel}:{event.dedupe_id}"):
            return ReceiveResult("duplicate")
        caller = commands.Caller(f"{channel}:{event.sender_id}", trust)
        out = await commands.handle(r, settings, event.key, cmd, caller, request.app.state.hooks,
                                    send=task_sender(request))
        if out.control == "compact":
            job = InboundMessage(key=event.key, text="/compact", sender_id=event.sender_id,
                                 trust=trust, kind="compact", compact_reason="command",
                                 reply_to=event.message_id,
                                 agent=bound_agent(settings.bindings, event.key))
            accepted = await enqueue(request, job, message_id=f"{channel}:{event.dedupe_id}")
            return ReceiveResult("command", accepted.run_id)
        if out.run_text is None:
            reply = out.reply or ""
            if not event.answers_inline:
                await reply_in_chat(request, event.key, reply, f"cmd:{channel}:{event.dedupe_id}")
            return ReceiveResult("command", reply=reply)
        text, profile = out.run_text, out.profile
    return await _queue_event(request, event, text, trust, profile)


async def _queue_event(
    request: Request, event: InboundEvent, text: str, trust: Trust,
    profile: RunProfile,
) -> ReceiveResult:
    settings: Settings = request.app.state.settings
    msg = InboundMessage(key=event.key, text=text, sender_id=event.sender_id, trust=trust,
                         profile=profile, reply_to=event.message_id,
                         agent=bound_agent(settings.bindings, event.key))
    sender = f"{event.key.channel}:{event.sender_id}"
    accepted = await enqueue(request, msg, message_id=f"{event.key.channel}:{event.dedupe_id}",
                             limits=accept_limits(settings, sender))
    match accepted.code:
        case AcceptCode.duplicate:
            return ReceiveResult("duplicate", accepted.run_id)
        case AcceptCode.refused:
            await reply_in_chat(request, event.key, BUSY_NOTICE, f"busy:{msg.run_id}")
            return ReceiveResult("refused")
        case AcceptCode.steered:
            return ReceiveResult("steered", accepted.run_id)
        case AcceptCode.queued:
            return ReceiveResult("queued", accepted.run_id)
        case AcceptCode.full:
            log.warning("dropped a message from %s: %s has %d messages waiting", sender,
                        event.key.as_str(), settings.limits.max_queued_per_conversation)
            return ReceiveResult("full", reply=refusal_notice(settings, accepted))
        case AcceptCode.rate_limited:
            log.warning("dropped a message from %s in %s: over %d messages a minute", sender,
                        event.key.as_str(), settings.limits.sender_messages_per_minute)
            return ReceiveResult("rate_limited", reply=refusal_notice(settings, accepted))
    assert_never(accepted.code)
