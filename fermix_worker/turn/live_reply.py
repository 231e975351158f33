"""Replies that appear in a Telegram or Slack chat while the model writes them.

Per channel (``FERMIX_TELEGRAM_STREAMING``, ``FERMIX_SLACK_STREAMING``):

* ``partial`` (default, as the reference systems): one message, sent once the text has been
  coming for :data:`~fermix_worker.turn.live_preview.FIRST_AFTER_S` (a reply done sooner
  arrives whole, as with ``off``), then edited as it grows at the chat's pace (Telegram 1 s a
  private chat, 3 s a group; Slack 1 s),
  skipping edits that would show nothing new. It shows the assistant message being written:
  after a tool call the next message's text replaces it (the reply is the last message only).
  The live text is shown safely half-written (plain text on Telegram); the final delivery
  edits the message to the exact reply with the normal formatting (a reply over the
  platform's limit: the first chunk in the message, the rest as new messages, each once).
* ``block``: finished paragraphs go out as messages of their own once at least
  :data:`~fermix_worker.turn.live_preview.BLOCK_MIN_CHARS` are ready (never inside a code
  block), nothing is edited; text written before a tool call is sent whole when the call
  starts; the final delivery sends what is left of the reply.
* ``off``: one message at the end (nothing here runs, and the turn's hot path is unchanged).

The work is done by one background thread (a greenlet under the gevent pool) per turn, fed by
the turn's :class:`~fermix_worker.turn.events.EventSink` (coalesced text, tool-call boundaries)
without ever blocking it: a slow or rate-limited platform delays the preview, never the model
(:class:`~fermix_worker.turn.live_preview.LiveReply`). This module starts it and ends it
(:class:`LiveReplies`).

Exactly once, fleet-wide: the live message's id and what it shows are in Redis, keyed by run
(:class:`~fermix_worker.turn.live_store.LiveStore`), so a turn resumed on another worker after
a crash keeps editing the same message (a second message posted by a racing worker is
deleted); the final delivery marks the record final first, and a worker still previewing
stops at that mark.
How a turn ends shows in the message: an error replaces the text with the error reply (what
``off`` would have sent), /stop keeps the text and adds :data:`STOPPED_NOTE`, a silent reply
deletes the message. A parked turn (subagents, an approval) leaves the message as written,
formatted, and continues in a new one when it resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

import redis

from fermix_shared.channels.base import ChannelError, EditsMessages, OutboundChannel
from fermix_shared.channels.modes import streaming_for
from fermix_shared.models import Channel, InboundMessage
from fermix_shared.settings import Settings
from fermix_worker.turn.live_preview import FIRST_AFTER_S, LiveChannel, LiveReply
from fermix_worker.turn.live_store import LiveStore

log = logging.getLogger(__name__)

ChannelLookup = Callable[[Channel], OutboundChannel | None]

STOPPED_NOTE = "⏹ Stopped before I finished it."


class LiveReplies:
    """Starts a turn's :class:`LiveReply` and ends it: the final reply, a /stop, silence.

    Everything here is a no-op, without touching Redis, when the channel streams ``off``."""

    def __init__(self, r: redis.Redis, settings: Settings, channels: ChannelLookup, *,
                 first_after: float = FIRST_AFTER_S):
        self._r = r
        self._settings = settings
        self._channels = channels
        self._first_after = first_after

    def _channel(self, msg: InboundMessage) -> LiveChannel | None:
        if msg.deliver_to is not None or msg.context != "interactive" or msg.kind != "message":
            return None
        if streaming_for(self._settings, msg.key.channel) == "off":
            return None
        channel = self._channels(msg.key.channel)
        return cast(LiveChannel, channel) if isinstance(channel, EditsMessages) else None

    def start(self, msg: InboundMessage) -> LiveReply | None:
        """The turn's live reply, or None (``off``, HTTP, a scheduled run)."""
        channel = self._channel(msg)
        if channel is None:
            return None
        mode = streaming_for(self._settings, msg.key.channel)
        assert mode != "off"
        return LiveReply(channel, self._r, msg.key, msg.run_id, mode,
                         first_after=self._first_after)

    def deliver(self, msg: InboundMessage, text: str) -> bool:
        """Deliver the final ``text`` through what was streamed (the live message edited to
        it, or the rest after the blocks sent); False when nothing was streamed (send it as
        usual). Raises ChannelError."""
        channel = self._channel(msg)
        if channel is None:
            return False
        state = LiveStore(self._r, msg.run_id).finalize()
        if mid := state.get("mid"):
            channel.finish_live(msg.key, mid, text, delivery_id=msg.run_id)
            return True
        sent = state.get("sent", "")
        if not sent or not text.startswith(sent):
            return False
        if rest := text[len(sent):].strip():
            channel.send_text(msg.key, rest, delivery_id=msg.run_id)
        return True

    def silent(self, msg: InboundMessage) -> None:
        """The turn answered nothing: the live message goes."""
        channel = self._channel(msg)
        if channel is None:
            return
        if mid := LiveStore(self._r, msg.run_id).finalize().get("mid"):
            try:
                channel.delete_live(msg.key, mid)
            except ChannelError as e:
                log.warning("run %s: deleting the live reply failed: %s", msg.run_id, e)

    def stopped(self, msg: InboundMessage) -> None:
        """/stop: the live message keeps its text and says it was stopped."""
        channel = self._channel(msg)
        if channel is None:
            return
        state = LiveStore(self._r, msg.run_id).finalize()
        if mid := state.get("mid"):
            shown = state.get("shown", "")
            try:
                channel.edit_live(msg.key, mid, f"{shown}\n\n{STOPPED_NOTE}".strip())
            except ChannelError as e:
                log.warning("run %s: marking the live reply stopped failed: %s", msg.run_id, e)
