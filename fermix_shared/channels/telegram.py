"""Telegram's sending side: replies as HTML chunks, paced and idempotent, and "typing...".

A reply (Markdown) is cut with :func:`chunk_markdown` and each chunk is rendered to Telegram
HTML. Chunks go out in order; each one is marked sent in Redis (``keys.delivered``) as soon as
Telegram accepts it, so a retried delivery resumes after the last chunk that went out and never
sends one twice. Every send first reserves a slot with the fleet-wide :class:`RateLimiter`:
about one message per second per private chat, one per 3 s per group (20 a minute), 30 a
second overall. A 429 blocks the chat's limit for ``retry_after`` seconds for every worker,
then the chunk is retried; a chunk whose HTML Telegram cannot parse goes out as plain text.

An approval question (:meth:`TelegramChannel.send_approval`) goes out the same way, with an
inline keyboard (Approve / Deny, :mod:`~fermix_shared.approvals.buttons`) under its
last chunk; the press comes back to ``POST /webhooks/telegram`` as a ``callback_query``.

A reply streamed while it is written (:class:`~fermix_shared.channels.base.EditsMessages`) is
one message: sent, then changed with ``editMessageText`` as plain text (a half-written
``**bold`` or code fence can never make Telegram refuse it), under the same per-chat pace as
sends; the final reply's first chunk edits it with the normal HTML formatting.

A reaction (:meth:`TelegramChannel.react`) is ``setMessageReaction``; a file
(:meth:`TelegramChannel.send_file`) is ``sendDocument``, paced like a chunk and marked sent the
same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from fermix_shared import keys
from fermix_shared.approvals.buttons import (
    APPROVE_LABEL,
    DENY_LABEL,
    telegram_callback_data,
)
from fermix_shared.channels import pieces
from fermix_shared.channels.base import ChannelError, RateLimited
from fermix_shared.channels.ratelimit import RateLimiter
from fermix_shared.channels.reactions import telegram_emoji
from fermix_shared.channels.telegram_api import TelegramApi, TelegramError
from fermix_shared.channels.telegram_format import (
    chunk_markdown,
    strip_markdown,
    to_telegram_html,
)
from fermix_shared.channels.typing import (
    TYPING_INTERVAL_SECONDS,
    TYPING_MAX_SECONDS,
    TypingIndicator,
)
from fermix_shared.errors import ConfigError
from fermix_shared.models import Channel, ConversationKey
from fermix_shared.settings import Settings

__all__ = ["TelegramApi", "TelegramChannel", "TelegramError", "approval_keyboard"]

log = logging.getLogger(__name__)

# Seconds between two sends: per private chat, per group (negative ids), and overall.
CHAT_INTERVAL_SECONDS = 1.0
GROUP_INTERVAL_SECONDS = 3.0
GLOBAL_INTERVAL_SECONDS = 1 / 30
# Sends of one chunk in all (429s, network and server errors count), then ChannelError.
MAX_ATTEMPTS = 5
# A file's caption, at most (Telegram: 1,024 characters); a longer one is sent before the file.
CAPTION_LIMIT = 1000
# Telegram secret_token: 1-256 characters, letters, digits, "_" and "-".
_SECRET_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# The updates our webhook reads (messages, and presses of our inline buttons).
ALLOWED_UPDATES = ("message", "edited_message", "callback_query")


def approval_keyboard(approval_id: str) -> dict[str, Any]:
    """The ``reply_markup`` under an approval question: one row, Approve and Deny."""
    return {"inline_keyboard": [[
        {"text": APPROVE_LABEL, "callback_data": telegram_callback_data("approved", approval_id)},
        {"text": DENY_LABEL, "callback_data": telegram_callback_data("denied", approval_id)},
    ]]}


class TelegramChannel:
    """:class:`~fermix_shared.channels.base.OutboundChannel` for Telegram.

    ``sleep`` is used for every wait (rate limits, 429s, retry backoff), so tests can record
    waits instead of sleeping. ``typing_interval``/``typing_max`` are the typing cadence and
    cap (4 s and 5 minutes). Raises ConfigError when no bot token is configured.
    """

    name: Channel = "telegram"

    def __init__(
        self,
        settings: Settings,
        r: redis.Redis,
        *,
        sleep: Callable[[float], None] = time.sleep,
        api: TelegramApi | None = None,
        typing_interval: float = TYPING_INTERVAL_SECONDS,
        typing_max: float = TYPING_MAX_SECONDS,
        chat_interval: float = CHAT_INTERVAL_SECONDS,
        group_interval: float = GROUP_INTERVAL_SECONDS,
    ) -> None:
        self._settings = settings
        self._r = r
        self._sleep = sleep
        self._api = api or TelegramApi.from_settings(settings)
        self._limiter = RateLimiter(r, sleep)
        self._typing_interval = typing_interval
        self._typing_max = typing_max
        self._chat_interval = chat_interval
        self._group_interval = group_interval

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        """Send ``text`` (Markdown) into the chat/topic of ``key``; see the module docstring.
        Raises ChannelError when a chunk cannot be sent (the chunks before it stay sent)."""
        self._send_chunks(key, text, delivery_id)

    def send_approval(self, key: ConversationKey, approval_id: str, text: str, *,
                      delivery_id: str) -> None:
        """Send the approval question ``text`` (Markdown) like :meth:`send_text`, with the
        Approve / Deny keyboard (:func:`approval_keyboard`) under its last chunk. Idempotent
        per ``delivery_id``. Raises ChannelError (or ValueError for a malformed id)."""
        keyboard = approval_keyboard(approval_id)
        self._send_chunks(key, text, delivery_id, last_markup=keyboard)

    # -- a live message (a reply streamed as it is written) ---------------------------------

    def live_limits(self, key: ConversationKey) -> list[tuple[str, float]]:
        """The chat's send pace (1 s private, 3 s group) and the bot's global one."""
        return [(self._chat_limit(key), self._interval(key)),
                ("telegram:global", GLOBAL_INTERVAL_SECONDS)]

    def live_text(self, md: str) -> str:
        """The first chunk of ``md`` as plain text (no entities Telegram could refuse; the
        final edit brings the formatting)."""
        chunks = chunk_markdown(md)
        return strip_markdown(chunks[0]) if chunks else ""

    def post_live(self, key: ConversationKey, shown: str) -> str:
        """Send the live message's first version (plain text); its ``message_id``."""
        message = self._live_call(key, "sendMessage", {**self._target(key), "text": shown})
        if not isinstance(message, dict) or "message_id" not in message:
            raise ChannelError("Telegram sendMessage returned no message")
        return str(message["message_id"])

    def edit_live(self, key: ConversationKey, message_id: str, shown: str) -> None:
        """Show ``shown`` (plain text) in the live message."""
        self._live_call(key, "editMessageText", {**self._edit_target(key, message_id),
                                                 "text": shown})

    def delete_live(self, key: ConversationKey, message_id: str) -> None:
        try:
            self._api.call("deleteMessage", self._edit_target(key, message_id))
        except TelegramError as e:
            raise ChannelError(str(e)) from e

    def finish_live(self, key: ConversationKey, message_id: str, text: str, *,
                    delivery_id: str) -> None:
        """The final reply: its first chunk (HTML) edits the live message, the rest follow."""
        self._send_chunks(key, text, delivery_id, replace=message_id)

    def _live_call(self, key: ConversationKey, method: str, params: dict[str, Any]) -> Any:
        if not str(params.get("text") or "").strip():
            raise ChannelError("nothing to show yet")
        try:
            return self._api.call(method, params)
        except TelegramError as e:
            if e.status == 429:
                retry_after = e.retry_after if e.retry_after is not None else 1.0
                self._limiter.block(self._chat_limit(key), retry_after)
                raise RateLimited(str(e), retry_after) from e
            if _not_modified(e):
                return None
            raise ChannelError(str(e)) from e

    def _edit_target(self, key: ConversationKey, message_id: str) -> dict[str, Any]:
        chat_id = self._target(key)["chat_id"]
        return {"chat_id": chat_id, "message_id": int(message_id)}

    # -- sending -----------------------------------------------------------------------------

    def _send_chunks(self, key: ConversationKey, text: str, delivery_id: str, *,
                     last_markup: dict[str, Any] | None = None,
                     replace: str | None = None) -> None:
        count, todo = pieces.pending(self._r, delivery_id, text, chunk_markdown(text))
        for idx, chunk in todo:
            self._send_chunk(key, chunk, last_markup if idx == count - 1 else None,
                             edit=replace if idx == 0 else None)
            pieces.mark_sent(self._r, delivery_id, idx, count)

    def _mark(self, done: str, part: str) -> None:
        pipe = self._r.pipeline(transaction=False)
        pipe.hset(done, part, "sent")
        pipe.expire(done, keys.DEDUPE_TTL_SECONDS)
        pipe.execute()

    # -- reactions and files -------------------------------------------------------------------

    def react(self, key: ConversationKey, message_id: str, emoji: str) -> None:
        """``setMessageReaction``: ``emoji`` on the message (it replaces the bot's reaction
        there, so the same one again changes nothing). Raises ChannelError."""
        if not message_id.isdigit():
            raise ChannelError(f"not a Telegram message id: {message_id!r}")
        params = {"chat_id": self._target(key)["chat_id"], "message_id": int(message_id),
                  "reaction": [{"type": "emoji", "emoji": telegram_emoji(emoji)}]}
        try:
            self._api.call("setMessageReaction", params)
        except TelegramError as e:
            raise ChannelError(str(e)) from e

    def send_file(self, key: ConversationKey, data: bytes, filename: str, caption: str, *,
                  delivery_id: str) -> None:
        """``sendDocument`` (multipart), ``caption`` as HTML under it; a caption longer than
        Telegram allows goes out first as its own message. Marked sent like a chunk, so a
        retried send never sends the file twice. Raises ChannelError."""
        if len(caption) > CAPTION_LIMIT:
            self._send_chunks(key, caption, f"{delivery_id}:caption")
            caption = ""
        done = keys.delivered(delivery_id)
        if self._r.hget(done, "file") is not None:
            return
        params: dict[str, Any] = {**self._target(key)}
        if caption.strip():
            params.update(caption=to_telegram_html(caption), parse_mode="HTML")
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self._limiter.acquire([(self._chat_limit(key), self._interval(key)),
                                   ("telegram:global", GLOBAL_INTERVAL_SECONDS)])
            try:
                self._api.upload("sendDocument", params, "document", filename, data)
                break
            except TelegramError as e:
                if e.status == 429:
                    self._limiter.block(self._chat_limit(key), e.retry_after or 1.0)
                elif e.cannot_parse_entities and "parse_mode" in params:
                    params = {**self._target(key), "caption": strip_markdown(caption)}
                elif not e.transient or attempt == MAX_ATTEMPTS:
                    raise ChannelError(str(e)) from e
                else:
                    self._sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
        else:
            raise ChannelError(f"Telegram sendDocument failed after {MAX_ATTEMPTS} attempts")
        self._mark(done, "file")

    @contextmanager
    def working(self, key: ConversationKey, message_id: str | None = None) -> Iterator[None]:
        """Shows "typing..." in the chat (and topic) at once, then every 4 s, for at most
        5 minutes; stops when the context exits. A failed send is logged, never raised."""
        params = {**self._target(key), "action": "typing"}
        indicator = TypingIndicator(
            lambda: self._api.call("sendChatAction", params),
            interval=self._typing_interval,
            max_duration=self._typing_max,
        )
        with indicator:
            yield

    def set_webhook(self, url: str) -> None:
        """Point the bot's updates at ``url`` (our ``POST /webhooks/telegram``), signed with
        ``FERMIX_TELEGRAM_WEBHOOK_SECRET``. Raises ConfigError or ChannelError."""
        secret = self._settings.telegram_webhook_secret
        if secret is None:
            raise ConfigError("FERMIX_TELEGRAM_WEBHOOK_SECRET must be set before setting a webhook")
        value = secret.get_secret_value()
        if not 1 <= len(value) <= 256 or not set(value) <= _SECRET_CHARS:
            raise ConfigError(
                "FERMIX_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters: letters, digits, _ or -"
            )
        self._api.call("setWebhook", {
            "url": url,
            "secret_token": value,
            "allowed_updates": list(ALLOWED_UPDATES),
            "drop_pending_updates": False,
        })

    def get_me(self) -> dict[str, Any]:
        """The bot's own User object (``id``, ``username``, ...)."""
        result = self._api.call("getMe")
        if not isinstance(result, dict):
            raise ChannelError("Telegram getMe returned no user")
        return result

    def _target(self, key: ConversationKey) -> dict[str, Any]:
        chat_id = key.chat_id
        params: dict[str, Any] = {
            "chat_id": int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id
        }
        if key.thread_scope != "root" and key.thread_scope.isdigit():
            # A forum topic: without it the reply would land in the General topic.
            params["message_thread_id"] = int(key.thread_scope)
        return params

    def _chat_limit(self, key: ConversationKey) -> str:
        return f"telegram:chat:{key.chat_id}"

    def _interval(self, key: ConversationKey) -> float:
        return self._group_interval if key.chat_id.startswith("-") else self._chat_interval

    def _send_chunk(self, key: ConversationKey, chunk: str,
                    reply_markup: dict[str, Any] | None = None, *,
                    edit: str | None = None) -> None:
        """Send ``chunk`` (or, with ``edit``, put it in that message instead)."""
        target = self._target(key)
        chat_limit = self._chat_limit(key)
        interval = self._interval(key)
        extra: dict[str, Any] = {} if reply_markup is None else {"reply_markup": reply_markup}
        method = "sendMessage" if edit is None else "editMessageText"
        where = target if edit is None else self._edit_target(key, edit)
        params: dict[str, Any] = {**where, "text": to_telegram_html(chunk), "parse_mode": "HTML",
                                  **extra}
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self._limiter.acquire([(chat_limit, interval),
                                   ("telegram:global", GLOBAL_INTERVAL_SECONDS)])
            try:
                self._api.call(method, params)
                return
            except TelegramError as e:
                error = e
            if method == "editMessageText" and _not_modified(error):
                return  # it already shows exactly this (a retried final edit)
            if method == "editMessageText" and _gone(error):
                log.warning("telegram: the live message is gone; sending the reply anew")
                method, where = "sendMessage", target
                params = {**target, "text": params["text"], **extra,
                          **({"parse_mode": "HTML"} if "parse_mode" in params else {})}
            elif error.status == 429:
                # Every worker holds off this chat; the next acquire waits it out.
                retry_after = error.retry_after if error.retry_after is not None else 1.0
                self._limiter.block(chat_limit, retry_after)
                log.warning("telegram %s rate limited, retrying after %.1f s", method,
                            retry_after)
            elif error.cannot_parse_entities and "parse_mode" in params:
                log.warning("telegram refused our HTML for a chunk; sending it as plain text")
                params = {**where, "text": strip_markdown(chunk), **extra}
            elif error.migrate_to_chat_id is not None:
                # The group became a supergroup: same conversation, new chat id.
                target["chat_id"] = where["chat_id"] = params["chat_id"] = (
                    error.migrate_to_chat_id)
            elif error.transient:
                if attempt == MAX_ATTEMPTS:
                    break
                backoff = min(0.5 * 2 ** (attempt - 1), 8.0)
                log.warning("telegram %s failed (%s), retrying in %.1f s",
                            method, error.status or "no answer", backoff)
                self._sleep(backoff)
            else:
                raise ChannelError(str(error)) from error
        raise ChannelError(f"Telegram {method} failed after {MAX_ATTEMPTS} attempts: {error}")


def _not_modified(e: TelegramError) -> bool:
    """Telegram's answer to an edit that would change nothing (not a failure for us)."""
    return e.status == 400 and "message is not modified" in e.description.lower()


def _gone(e: TelegramError) -> bool:
    """The message to edit is no longer there (deleted in the chat) or cannot be edited."""
    text = e.description.lower()
    return e.status == 400 and ("message to edit not found" in text
                                or "message can't be edited" in text)
