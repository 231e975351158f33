"""Deliverer: a turn's outcome reaches the user once, and only from the turn that holds the
conversation.

HTTP: the run record *is* the delivery, written by ``finish`` in the same atomic step that
commits history and releases the conversation (compare-and-deliver). Chat platforms: a send
cannot be undone, so ``begin_delivery`` first checks and marks atomically (still the active
turn, not cancelled), then the channel sends (idempotent per run, so a resumed delivery never
repeats a chunk), then ``finish`` commits and releases. A turn recovered after its worker
died delivers again: the chunk marks skip what was sent (only a chunk in flight can repeat).

Under a durability wait (``FERMIX_REDIS_WAIT_REPLICAS``,
:class:`~fermix_shared.redis.durability.DeliveryWait`) the mark is on a replica before the send, with
the turn's checkpointed answer, and holds the primary's replication id. The chunk marks are
written after each send and not waited for, so a failover can lose them: a turn recovered on
another primary (the mark's id is not the primary's, or it has none) that finds the mark and no
chunk marked sent commits without sending (``resend=False``), so a reply goes out once even
when the primary dies between the send and the commit's replication
(:meth:`Deliverer.sent_before_a_failover`). On the same primary the marks are complete and the
recovered turn delivers as above: a worker killed between the mark and the send does not cost
the user the reply. A reply that was streamed into the chat
while it was written (:mod:`~fermix_worker.turn.live_reply`) is delivered through what was
streamed: its live message edited to the final text, or the rest after the blocks sent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from fermix_shared import tracing
from fermix_shared.channels.base import ChannelError, OutboundChannel
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage
from fermix_shared.models import Channel, InboundMessage, RunRecord, RunStatus
from fermix_shared.redis.durability import DeliveryWait
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Cleared, DeliveryGate, FinishResult, Released
from fermix_worker.turn.live_preview import LiveReply
from fermix_worker.turn.live_reply import LiveReplies

log = logging.getLogger(__name__)

ChannelLookup = Callable[[Channel], OutboundChannel | None]


class Deliverer:
    def __init__(self, channels: ChannelLookup, hooks: HookRegistry, history_cap: int,
                 live: LiveReplies | None = None, wait: DeliveryWait | None = None):
        self._channels = channels
        self._wait = wait
        self._hooks = hooks
        self._cap = history_cap
        self._live = live

    def live(self, msg: InboundMessage) -> LiveReply | None:
        """The turn's reply written live into its chat, or None (streaming ``off``, HTTP)."""
        return None if self._live is None else self._live.start(msg)

    def stopped(self, msg: InboundMessage) -> None:
        """A /stop ended the turn: a live reply says so."""
        if self._live is not None:
            self._live.stopped(msg)

    def deliver(
        self, msg: InboundMessage, lease: TurnLease, record: RunRecord, commit: list[ChatMessage],
        *, resend: bool = True,
    ) -> FinishResult:
        """Deliver ``record``'s reply (or error) and commit ``commit``. ``resend`` False: an
        earlier holder of the turn began this delivery (see the module docstring): commit
        only.

        A scheduled run delivers to ``msg.deliver_to`` when it has one (``record.delivery``
        says how that went), else only to its run record. Nothing is sent or written when the
        answer is :class:`Fenced` or :class:`StopWon`. With tracing on, the delivery is a span
        of the turn's (its channel and outcome; never the text).
        """
        target = msg.deliver_to or msg.key
        with tracing.span("fermix.deliver", {
            "fermix.run_id": msg.run_id, "fermix.channel": target.channel,
            "fermix.delivery.resend": resend,
        }) as span:
            result = self._deliver(msg, lease, record, commit, resend=resend)
            if span.is_recording():
                span.set_attributes({"fermix.delivery.result": type(result).__name__,
                                     "fermix.run.status": record.status.value,
                                     "fermix.delivery": record.delivery or ""})
            return result

    def _deliver(
        self, msg: InboundMessage, lease: TurnLease, record: RunRecord, commit: list[ChatMessage],
        *, resend: bool,
    ) -> FinishResult:
        text = record.reply if record.status is RunStatus.ok else record.error
        target = msg.deliver_to or msg.key
        if text and self._hooks.has("message_sending"):
            out = self._hooks.call("message_sending", {
                "run_id": msg.run_id, "channel": target.channel, "chatId": target.chat_id,
                "text": text,
            })
            text = None if out.get("cancel") else str(out.get("text", text))
            if record.status is RunStatus.ok:
                record.reply = text
        history = [m.model_dump_json() for m in commit]
        channel = self._channels(target.channel)
        if channel is None:
            if msg.deliver_to is not None and text:
                # HTTP has no push: the run record is the delivery; a platform without a
                # token configured is a failed delivery.
                record.delivery = ("stored" if target.channel in ("http", "console")
                                   else "failed")
            result = lease.finish(record, history, self._cap, deliver=True)
        elif not resend:
            log.warning("run %s: its reply was being delivered when its turn was lost; "
                        "committed without sending it again", msg.run_id)
            result = lease.finish(record, history, self._cap, deliver=False)
        else:
            gate = self._begin(lease)
            if not isinstance(gate, Cleared):
                return gate
            if not text and self._live is not None:
                self._live.silent(msg)
            if text:
                try:
                    if self._live is None or not self._live.deliver(msg, text):
                        channel.send_text(target, text, delivery_id=msg.run_id)
                    record.delivery = "sent" if msg.deliver_to is not None else None
                except ChannelError as e:
                    log.error("run %s: delivery to %s failed: %s", msg.run_id, target.channel, e)
                    record.status, record.error = RunStatus.error, f"could not deliver the reply: {e}"
                    record.delivery = "failed" if msg.deliver_to is not None else None
                    history = []
            result = lease.finish(record, history, self._cap, deliver=False)
        if isinstance(result, Released) and text and self._hooks.has("message_sent"):
            self._hooks.call("message_sent", {
                "run_id": msg.run_id, "channel": target.channel, "chatId": target.chat_id,
                "text": text,
            })
        return result

    def _begin(self, lease: TurnLease) -> DeliveryGate:
        """The mark before a send, on a replica first when the rule asks (one WAIT)."""
        if self._wait is None:
            return lease.begin_delivery()
        with self._wait.pinned() as conn:
            gate = lease.begin_delivery(via=conn, mark=self._wait.mark(conn))
            if isinstance(gate, Cleared):
                self._wait.after_mark(conn)
        return gate

    def sent_before_a_failover(self, lease: TurnLease, delivery_id: str) -> bool:
        """Whether a recovered turn must commit its reply without sending it (``resend``
        False): an earlier holder marked it as being delivered, no chunk of it is marked sent,
        and the primary changed since the mark (a failover may have lost the chunk marks).
        Without a durability wait, never: the delivery resumes and skips what was sent."""
        if self._wait is None or self._wait.watch.rule.replicas == 0:
            return False
        mark = lease.delivery_mark(delivery_id)
        return mark is not None and self._wait.failed_over_since(mark)

    def notice(self, msg: InboundMessage, text: str, delivery_id: str) -> None:
        """A notice (e.g. compaction) into the turn's chat and thread, once per delivery id.
        The HTTP channel has no chat: its notices are the run's events."""
        channel = self._channels(msg.key.channel)
        if channel is None:
            return
        try:
            channel.send_text(msg.key, text, delivery_id=delivery_id)
        except ChannelError as e:
            log.warning("notice to %s failed: %s", msg.key.channel, e)

    def working(self, msg: InboundMessage) -> AbstractContextManager[None]:
        """The channel's 'working…' indicator for this turn, or a no-op."""
        channel = self._channels(msg.key.channel)
        return channel.working(msg.key, msg.reply_to) if channel else contextlib.nullcontext()
