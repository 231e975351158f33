"""Slack's sending side, over the official ``slack_sdk`` WebClient.

A conversation is a Slack channel id (``C…`` channel, ``D…`` DM) and a thread: ``thread_scope``
is the thread's root ``ts``, or ``root`` for a DM outside any thread (posted without
``thread_ts``). A reply goes out as Markdown pieces of at most 12,000 characters in order, one
``chat.postMessage`` each: the piece in a ``markdown`` block (Slack renders its headings, tables
and code blocks) and, as ``text`` (notifications, clients without blocks), the piece as mrkdwn
(:mod:`~fermix_shared.channels.slack_format`). Posts are paced by the shared per-channel rate
limiter (Slack allows about one message a second per channel) and idempotent per delivery id.
Errors become :class:`ChannelError`; tokens are never logged. The Web API calls themselves
(the client, retries, Slack's error answers) are in :mod:`~fermix_shared.channels.slack_api`;
this module decides what to send.

An approval question (:meth:`SlackChannel.send_approval`) is posted the same way, its last
message's markdown block followed by an actions block with Approve / Deny buttons
(:mod:`~fermix_shared.approvals.buttons`). A press comes back to
``POST /webhooks/slack/interactions`` (the app's Interactivity Request URL).

A reply streamed while it is written (:class:`~fermix_shared.channels.base.EditsMessages`) is
one message, posted and then changed with ``chat.update`` (Tier 3, ~50 a minute) under the
same per-channel pace as posts. Each version is a message like the final ones (markdown block
and mrkdwn ``text``), so the reply does not change look when it is done. Half-written Markdown
is safe to show: an unclosed ``**`` stays text, and an open code fence is closed at the end of
the piece (as when a piece is cut inside a code block). The final reply's first piece is the
last update.

A reaction (:meth:`SlackChannel.react`) is ``reactions.add``; a file
(:meth:`SlackChannel.send_file`) is uploaded with ``files_upload_v2``, marked sent like a
message. A private answer (``chat.postEphemeral``) and a file's comment stay mrkdwn ``text``
alone.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import redis

from fermix_shared import keys
from fermix_shared.approvals.buttons import (
    APPROVE_LABEL,
    DENY_LABEL,
    SLACK_APPROVE_ACTION,
    SLACK_DENY_ACTION,
)
from fermix_shared.approvals.store import valid_id
from fermix_shared.channels import pieces
from fermix_shared.channels.base import ChannelError
from fermix_shared.channels.ratelimit import RateLimiter
from fermix_shared.channels.reactions import slack_name
from fermix_shared.channels.slack_api import SlackApi, pace_key, safe
from fermix_shared.channels.slack_format import (
    MARKDOWN_LIMIT,
    fallback_text,
    markdown_block,
    markdown_pieces,
    slack_chunks,
    to_mrkdwn,
)
from fermix_shared.channels.typing import (
    TYPING_INTERVAL_SECONDS,
    TYPING_MAX_SECONDS,
    TypingIndicator,
)
from fermix_shared.models import Channel, ConversationKey
from fermix_shared.settings import Settings

log = logging.getLogger(__name__)

# Slack's documented pace for chat.postMessage: about one message per second per channel.
CHANNEL_INTERVAL_S = 1.0
STATUS_TEXT = "is working…"
WORKING_REACTION = "eyes"
# Answers meaning this workspace or token cannot set assistant thread statuses at all: stop
# trying for the life of the process and use the reaction instead.
_NO_STATUS_ERRORS = frozenset(
    {"unknown_method", "not_allowed_token_type", "missing_scope", "method_deprecated"}
)

_TS = re.compile(r"^\d+\.\d+$")  # a message ts (slash commands carry a trigger id instead)
# The workspaces (API base, token) that have no assistant thread status, for the process's life.
_status_unsupported: set[tuple[str, str]] = set()
_lock = threading.Lock()


class SlackChannel:
    """:class:`~fermix_shared.channels.base.OutboundChannel` for Slack.

    ``typing_interval``/``typing_max`` are the working indicator's cadence and cap (4 s and
    5 minutes, as on Telegram)."""

    name: Channel = "slack"

    def __init__(
        self, settings: Settings, r: redis.Redis, *, sleep: Callable[[float], None] = time.sleep,
        channel_interval: float = CHANNEL_INTERVAL_S,
        typing_interval: float = TYPING_INTERVAL_SECONDS,
        typing_max: float = TYPING_MAX_SECONDS,
    ) -> None:
        self._interval = channel_interval
        self._typing_interval = typing_interval
        self._typing_max = typing_max
        self._r = r
        self._api = SlackApi(settings, RateLimiter(r, sleep), sleep=sleep,
                             interval=channel_interval)
        self._bot_user_id = settings.slack_bot_user_id

    # -- sending -----------------------------------------------------------------------------

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        """Post ``text`` (Markdown) into the conversation as messages of at most 12,000
        characters, in order, each a markdown block with its mrkdwn as ``text``. Messages
        already marked delivered under ``delivery_id`` are skipped, so a retried delivery
        resumes at the first one that did not go out. Raises ChannelError."""
        self._send_pieces(key, text, delivery_id)

    def send_approval(self, key: ConversationKey, approval_id: str, text: str, *,
                      delivery_id: str) -> None:
        """Post the approval question ``text`` (Markdown) into the conversation like
        :meth:`send_text`; its last message's markdown block is followed by
        :func:`approval_buttons`. Idempotent per ``delivery_id``. Raises ChannelError (or
        ValueError for a malformed id)."""
        if not valid_id(approval_id):
            raise ValueError(f"not an approval id: {approval_id!r}")
        self._send_pieces(key, text, delivery_id, approval_id=approval_id)

    def send_private(self, key: ConversationKey, user_id: str, text: str) -> None:
        """``chat.postEphemeral``: ``text`` shown to ``user_id`` alone, in the conversation's
        channel and thread (Slack keeps it for that session only). Raises ChannelError."""
        args: dict[str, Any] = {"channel": key.chat_id, "user": user_id,
                                "text": slack_chunks(text)[0]}
        if key.thread_scope != "root":
            args["thread_ts"] = key.thread_scope
        self._api.post_ephemeral(args)

    def _send_pieces(self, key: ConversationKey, md: str, delivery_id: str, *,
                     approval_id: str | None = None, replace: str | None = None) -> None:
        """Each Markdown piece of ``md`` as one message (the first one into the message
        ``replace``, if it can still be changed), marked sent under ``delivery_id``; a retry
        sends the rest of the first attempt's cut (fermix_shared/channels/pieces.py)."""
        thread_ts = None if key.thread_scope == "root" else key.thread_scope
        count, todo = pieces.pending(self._r, delivery_id, md, markdown_pieces(md))
        for idx, piece in todo:
            text, blocks = message_payload(piece)
            if approval_id and idx == count - 1:
                blocks.append(approval_buttons(approval_id))
            if not (idx == 0 and replace
                    and self._api.update(key.chat_id, replace, text, blocks)):
                self._api.post(key.chat_id, text, thread_ts, blocks)
            pieces.mark_sent(self._r, delivery_id, idx, count)

    def _mark(self, mark: str, part: str) -> None:
        pipe = self._r.pipeline()
        pipe.hset(mark, part, "sent")
        pipe.expire(mark, keys.DEDUPE_TTL_SECONDS)
        pipe.execute()

    # -- reactions and files -------------------------------------------------------------------

    def react(self, key: ConversationKey, message_id: str, emoji: str) -> None:
        """``reactions.add`` on the message ``message_id`` (its ``ts``); the same reaction
        again is not an error. Raises ChannelError."""
        if not _TS.match(message_id):
            raise ChannelError(f"not a Slack message ts: {message_id!r}")
        self._api.react(key.chat_id, message_id, slack_name(emoji))

    def send_file(self, key: ConversationKey, data: bytes, filename: str, caption: str, *,
                  delivery_id: str) -> None:
        """The file into the conversation's thread, ``caption`` (as mrkdwn) as its comment;
        marked sent like a message, so a retried send never uploads it twice."""
        mark = keys.delivered(delivery_id)
        if self._r.hget(mark, "file") is not None:
            return
        thread_ts = None if key.thread_scope == "root" else key.thread_scope
        comment = to_mrkdwn(caption) if caption.strip() else ""
        self._api.upload(key.chat_id, thread_ts, data, filename, comment)
        self._mark(mark, "file")

    # -- a live message (a reply streamed as it is written) ---------------------------------

    def live_limits(self, key: ConversationKey) -> list[tuple[str, float]]:
        """The channel's pace (about one change a second)."""
        return [(pace_key(key.chat_id), self._interval)]

    def live_text(self, md: str) -> str:
        """The first Markdown piece of ``md``, an open code fence closed (safe half-written:
        see the module docstring)."""
        pieces = markdown_pieces(md)
        return pieces[0] if pieces else ""

    def post_live(self, key: ConversationKey, shown: str) -> str:
        """Post the live message's first version (``shown``: Markdown, as a markdown block
        with its mrkdwn as ``text``); its ``ts``."""
        args: dict[str, Any] = {"channel": key.chat_id, "unfurl_links": False}
        if key.thread_scope != "root":
            args["thread_ts"] = key.thread_scope
        answer = self._live_call(key, "chat.postMessage", args, shown)
        ts = answer.get("ts") if answer is not None else None
        if not isinstance(ts, str):
            raise ChannelError("slack chat.postMessage returned no ts")
        return ts

    def edit_live(self, key: ConversationKey, message_id: str, shown: str) -> None:
        """Show ``shown`` (Markdown) in the live message, as :meth:`post_live` does."""
        self._live_call(key, "chat.update", {"channel": key.chat_id, "ts": message_id}, shown)

    def delete_live(self, key: ConversationKey, message_id: str) -> None:
        self._api.delete(key.chat_id, message_id)

    def finish_live(self, key: ConversationKey, message_id: str, text: str, *,
                    delivery_id: str) -> None:
        """The final reply: its first piece updates the live message, the rest are posted."""
        self._send_pieces(key, text, delivery_id, replace=message_id)

    def _live_call(self, key: ConversationKey, method: str, args: dict[str, Any],
                   shown: str) -> dict[str, Any] | None:
        if not shown.strip():
            raise ChannelError("nothing to show yet")
        text, blocks = message_payload(shown)
        return self._api.call(key.chat_id, method, {**args, "text": text, "blocks": blocks})

    # -- working indicator -------------------------------------------------------------------

    def working(self, key: ConversationKey, message_id: str | None) -> AbstractContextManager[None]:
        """While open, a thread status ("is working…") where the workspace supports assistant
        threads, set again every 4 s, else an :eyes: reaction on the user's message; cleared on
        exit, or after 5 minutes regardless. Never raises on its own account: a failure to show
        the indicator is logged and the turn goes on."""
        return self._working(key, message_id)

    @contextmanager
    def _working(self, key: ConversationKey, message_id: str | None) -> Iterator[None]:
        channel = key.chat_id
        thread_ts = None if key.thread_scope == "root" else key.thread_scope
        shown: _Shown | None = None
        if thread_ts and self._api.workspace() not in _status_unsupported:
            shown = self._try_status(channel, thread_ts)
        if shown is None and message_id and _TS.match(message_id):
            shown = self._try_reaction(channel, message_id)
        if shown is None:
            yield
            return
        # Shown once here (to learn whether the status works), then by the same indicator as
        # Telegram's typing; a reaction stays by itself and only needs taking off at the cap.
        indicator = TypingIndicator(
            shown.refresh or (lambda: None),
            interval=self._typing_interval if shown.refresh else max(self._typing_max, 1.0),
            max_duration=self._typing_max, send_at_once=False, on_expire=shown.clear)
        try:
            with indicator:
                yield
        finally:
            try:
                shown.clear()
            except Exception as e:  # the indicator must never break a turn
                log.warning("slack: clearing the working indicator failed: %s", safe(e))

    def _try_status(self, channel: str, thread_ts: str) -> _Shown | None:
        client = self._api.client_or_none()
        if client is None:
            return None

        def show(status: str) -> None:
            client.assistant_threads_setStatus(
                channel_id=channel, thread_ts=thread_ts, status=status)

        try:
            show(STATUS_TEXT)
        except Exception as e:
            error = safe(e)  # Slack's error code, or the exception's type and text
            if error in _NO_STATUS_ERRORS:
                with _lock:
                    _status_unsupported.add(self._api.workspace())
                log.info("slack: no assistant thread status here (%s); using reactions", error)
            else:
                log.info("slack: setStatus failed (%s); using a reaction this time", error)
            return None
        return _Shown(lambda: show(""), refresh=lambda: show(STATUS_TEXT))

    def _try_reaction(self, channel: str, message_id: str) -> _Shown | None:
        client = self._api.client_or_none()
        if client is None:
            return None
        try:
            client.reactions_add(channel=channel, timestamp=message_id, name=WORKING_REACTION)
        except Exception as e:
            log.warning("slack: reactions.add failed: %s", safe(e))
            return None
        return _Shown(lambda: client.reactions_remove(
            channel=channel, timestamp=message_id, name=WORKING_REACTION))

    # -- identity ----------------------------------------------------------------------------

    def bot_user_id(self) -> str:
        """Our bot's user id (``U…``): the setting, else ``auth.test`` (asked once)."""
        if self._bot_user_id is None:
            self._bot_user_id = self._api.auth_user_id()
        return self._bot_user_id


class _Shown:
    """A working indicator on show: ``refresh`` shows it again (None: it stays by itself);
    ``clear`` takes it off, once, whoever asks first (the 5-minute cap or the turn's end)."""

    def __init__(self, undo: Callable[[], object], refresh: Callable[[], None] | None = None,
                 ) -> None:
        self._undo = undo
        self.refresh = refresh
        self._cleared = threading.Event()

    def clear(self) -> None:
        if not self._cleared.is_set():
            self._cleared.set()
            self._undo()


def message_payload(md: str) -> tuple[str, list[dict[str, Any]]]:
    """One message's ``text`` and ``blocks`` for the Markdown ``md``: the mrkdwn fallback and a
    markdown block. Past :data:`MARKDOWN_LIMIT` (a live message with the stopped note added)
    the block keeps the first piece."""
    if len(md) > MARKDOWN_LIMIT:
        md = markdown_pieces(md)[0]
    return fallback_text(md), [markdown_block(md)]


def approval_buttons(approval_id: str) -> dict[str, Any]:
    """The actions block under an approval question: Approve / Deny, their ``value`` the id."""

    def button(label: str, action_id: str, style: str) -> dict[str, Any]:
        return {"type": "button", "action_id": action_id, "style": style, "value": approval_id,
                "text": {"type": "plain_text", "text": label}}

    return {"type": "actions", "block_id": f"fx_approval_{approval_id}", "elements": [
        button(APPROVE_LABEL, SLACK_APPROVE_ACTION, "primary"),
        button(DENY_LABEL, SLACK_DENY_ACTION, "danger"),
    ]}
