"""Telegram webhook: ``POST /webhooks/telegram``.

Telegram signs nothing; it echoes the ``secret_token`` we gave ``setWebhook`` in the
``X-Telegram-Bot-Api-Secret-Token`` header. Without a configured secret the route refuses
everything (403); a missing or wrong header is refused (401) before the body is read. Accepted
messages go through :func:`fermix_gateway.inbound.receive` (trust, commands, durable
de-duplication by ``update_id``, queueing). Telegram retries any non-2xx answer, so everything
we choose to ignore is acknowledged with 200; a body that cannot be an Update is refused with
400 and the reason (:mod:`fermix_gateway.bodies`), never a 500.

A ``callback_query`` is a press of an inline button. Presses of our approval buttons
(``fx:approve:<id>`` / ``fx:deny:<id>``) are answered by
:func:`fermix_gateway.webhooks.buttons.press` (de-duplicated by ``update_id``, owners only);
the callback is answered in the webhook's own response (Telegram runs a Bot API method given
as the reply: ``answerCallbackQuery``, the outcome shown as a notification), so the gateway
calls no platform itself. A decision is also said in the chat, for everyone, through a worker.
Other buttons' presses are only acknowledged (the button stops spinning).
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fermix_gateway.bodies import MalformedBody, json_object
from fermix_gateway.inbound import receive, reply_in_chat
from fermix_gateway.webhooks.buttons import press
from fermix_shared.approvals.buttons import parse_telegram_callback_data
from fermix_shared.channels.base import ApprovalPress, InboundEvent
from fermix_shared.channels.telegram_format import strip_markdown
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter()

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_COMMAND = re.compile(r"^/(?P<name>\w+)(?:@(?P<target>\w+))?(?=\s|$)")
# How long a failed getMe keeps us from asking again (seconds).
_LOOKUP_RETRY_SECONDS = 60.0
# answerCallbackQuery's text: 0-200 characters.
CALLBACK_TEXT_LIMIT = 200
_usernames: dict[str, tuple[str | None, float]] = {}


class TgUser(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int
    is_bot: bool = False
    username: str | None = None


class TgChat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int
    type: str


class TgRepliedMessage(BaseModel):
    """The message a message replies to: only its author matters here."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    from_: TgUser | None = Field(default=None, alias="from")


class TgMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    message_id: int
    from_: TgUser | None = Field(default=None, alias="from")
    chat: TgChat
    text: str | None = None
    caption: str | None = None
    message_thread_id: int | None = None
    is_topic_message: bool = False
    reply_to_message: TgRepliedMessage | None = None


class TgCallbackQuery(BaseModel):
    """A press of an inline button. ``message`` is the message the button is under (possibly
    an "inaccessible" one: then only its chat and id are given)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    id: str
    from_: TgUser = Field(alias="from")
    message: TgMessage | None = None
    data: str | None = None


class TgUpdate(BaseModel):
    """The part of an Update we read; other kinds (``edited_message``, ``channel_post``,
    ``my_chat_member``, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")
    update_id: int
    message: TgMessage | None = None
    callback_query: TgCallbackQuery | None = None


@dataclass(frozen=True)
class ButtonCallback:
    """A ``callback_query``: the id Telegram wants answered, and the approval answer the button
    carries (None for a button that is not one of ours)."""

    query_id: str
    press: ApprovalPress | None


def parse_update(
    payload: dict[str, Any], settings: Settings, *, bot_username: str | None = None
) -> InboundEvent | None:
    """The user message in an Update, or None for anything we do not answer.

    Answered: new ``message`` updates with text (or a caption) from a person. In groups with
    ``telegram_group_mention_only`` only messages addressed to the bot: ``@bot_username``
    anywhere (removed from the text), a ``/command`` (or ``/command@bot_username``), or a reply
    to one of the bot's messages. A ``/command@otherbot`` is never ours. The conversation is the
    chat, scoped to its forum topic when the message belongs to one. ``bot_username`` overrides
    ``settings.telegram_bot_username``. Raises pydantic's ValidationError for a malformed body.
    """
    update = TgUpdate.model_validate(payload)
    msg = update.message
    if msg is None or msg.from_ is None or msg.from_.is_bot or msg.chat.type == "channel":
        return None
    text = msg.text if msg.text is not None else msg.caption
    if not text or not text.strip():
        return None
    username = (bot_username or settings.telegram_bot_username or "").lstrip("@") or None
    command = _COMMAND.match(text)
    if command and command["target"] and (
        username is None or command["target"].lower() != username.lower()
    ):
        return None
    mentions = 0
    if username:
        mention = re.compile(rf"(?<![\w@])@{re.escape(username)}(?!\w)[,:]?", re.IGNORECASE)
        stripped, mentions = mention.subn("", text)
        # A message that is nothing but the mention still reaches the agent as written.
        text = re.sub(r"[ \t]{2,}", " ", stripped).strip() or text
    if (msg.chat.type in ("group", "supergroup") and settings.telegram_group_mention_only
            and not (mentions or command or _replies_to_bot(msg, username, settings))):
        return None
    return InboundEvent(
        key=_conversation(msg),
        sender_id=str(msg.from_.id),
        text=text,
        dedupe_id=str(update.update_id),
        message_id=str(msg.message_id),
        bot_name=username,
    )


def parse_callback(payload: dict[str, Any]) -> ButtonCallback | None:
    """The button press in an Update, or None when the Update is not a ``callback_query``.
    The press is in the conversation of the message the button is under (its chat and forum
    topic). Raises pydantic's ValidationError for a malformed body."""
    update = TgUpdate.model_validate(payload)
    query = update.callback_query
    if query is None:
        return None
    ours = parse_telegram_callback_data(query.data)
    if ours is None:
        return ButtonCallback(query.id, None)
    decision, approval_id = ours
    return ButtonCallback(query.id, ApprovalPress(
        channel="telegram", sender_id=str(query.from_.id), approval_id=approval_id,
        decision=decision, dedupe_id=str(update.update_id),
        key=_conversation(query.message) if query.message is not None else None,
    ))


def _conversation(msg: TgMessage) -> ConversationKey:
    """The chat, scoped to its forum topic when the message belongs to one."""
    scope = (str(msg.message_thread_id)
             if msg.is_topic_message and msg.message_thread_id is not None else "root")
    return ConversationKey(channel="telegram", chat_id=str(msg.chat.id), thread_scope=scope)


def _replies_to_bot(msg: TgMessage, username: str | None, settings: Settings) -> bool:
    author = msg.reply_to_message.from_ if msg.reply_to_message else None
    if author is None:
        return False
    if username and author.username and author.username.lower() == username.lower():
        return True
    # Without a username, the bot's id is the token's first part.
    return author.is_bot and author.id == _bot_id(settings)


def _bot_id(settings: Settings) -> int | None:
    token = settings.telegram_bot_token
    head = token.get_secret_value().split(":", 1)[0] if token else ""
    return int(head) if head.isdigit() else None


async def _bot_username(settings: Settings) -> str | None:
    """``telegram_bot_username``, else the bot's username from getMe (cached per process)."""
    if settings.telegram_bot_username:
        return settings.telegram_bot_username.lstrip("@")
    token = settings.telegram_bot_token
    if token is None:
        return None
    cache_key = f"{settings.telegram_api_base}|{token.get_secret_value()}"
    cached = _usernames.get(cache_key)
    if cached is not None and (cached[0] is not None or time.monotonic() < cached[1]):
        return cached[0]
    username: str | None = None
    url = f"{settings.telegram_api_base.rstrip('/')}/bot{token.get_secret_value()}/getMe"
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
            result = (await client.post(url)).json().get("result") or {}
        username = result.get("username") if isinstance(result, dict) else None
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        log.warning("telegram getMe failed (%s); set FERMIX_TELEGRAM_BOT_USERNAME",
                    type(e).__name__)
    _usernames[cache_key] = (username, time.monotonic() + _LOOKUP_RETRY_SECONDS)
    return username


def _refuse(status: int, error: str) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status)


@router.post("/webhooks/telegram")
async def telegram_webhook(request: Request) -> JSONResponse:
    """One Update: verified by its secret header, parsed, handed to ``receive``, acknowledged."""
    settings: Settings = request.app.state.settings
    secret = settings.telegram_webhook_secret
    if secret is None:
        return _refuse(403, "telegram webhook secret is not configured")
    given = request.headers.get(SECRET_HEADER)
    if given is None or not hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"),
        secret.get_secret_value().encode("utf-8", "surrogateescape"),
    ):
        log.warning("telegram: refused an update without the right secret token")
        return _refuse(401, "missing or wrong X-Telegram-Bot-Api-Secret-Token")
    try:
        payload = json_object(await request.body())
    except MalformedBody as e:
        log.warning("telegram: refused an update: %s", e)
        return _refuse(400, str(e))
    try:
        callback = parse_callback(payload)
        event = None if callback is not None else parse_update(
            payload, settings, bot_username=await _bot_username(settings))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        log.warning("telegram: refused an update: %s: %s", where, first["msg"])
        return _refuse(400, f"not a Telegram update: {where}: {first['msg']}")
    if callback is not None:
        return await _answer_callback(request, callback)
    if event is None:
        log.debug("telegram: ignored update %s", payload.get("update_id"))
        return JSONResponse({"ok": True})
    await receive(request, event)
    return JSONResponse({"ok": True})


async def _answer_callback(request: Request, callback: ButtonCallback) -> JSONResponse:
    """Handle a button press; the webhook's reply answers the callback (stops the button's
    spinner and shows the outcome to the presser)."""
    reply: dict[str, Any] = {"method": "answerCallbackQuery",
                             "callback_query_id": callback.query_id}
    pressed = callback.press
    if pressed is None:
        log.debug("telegram: acknowledged a press of a button that is not ours")
        return JSONResponse(reply)
    outcome = await press(request, pressed)
    reply["text"] = _notification(outcome.text)
    if outcome.kind == "decided" and pressed.key is not None:
        # Everyone in the chat sees the answer; other outcomes concern the presser alone.
        await reply_in_chat(request, pressed.key, outcome.text,
                            f"button:telegram:{pressed.dedupe_id}")
    return JSONResponse(reply)


def _notification(text: str) -> str:
    """A sentence (Markdown) as answerCallbackQuery's plain text, within its limit."""
    plain = strip_markdown(text).strip()
    if len(plain) <= CALLBACK_TEXT_LIMIT:
        return plain
    return plain[:CALLBACK_TEXT_LIMIT - 1] + "…"
