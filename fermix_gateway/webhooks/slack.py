"""Slack webhooks: the Events API and slash commands.

Every request must carry a valid ``v0`` signature (HMAC-SHA256 of ``v0:{timestamp}:{body}``
with the app's signing secret) no older than five minutes; anything else is refused with 401
before it is parsed. Accepted messages go through :func:`fermix_gateway.inbound.receive`
(trust, commands, durable de-duplication by Slack's ``event_id``, queueing), so a Slack retry
(``X-Slack-Retry-Num``) is harmless. Slack wants an answer within 3 s: nothing slow runs here.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from slack_sdk.signature import SignatureVerifier

from fermix_gateway.inbound import receive
from fermix_shared.channels.base import InboundEvent
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter()

# Slash commands registered one by one (``/stop``) map to ``/stop``; any other command name is
# an umbrella (``/fermix stop``, ``/fermix what is 6*7``).
SLASH_COMMANDS = frozenset(
    {"stop", "new", "status", "help", "whoami", "ultra", "clear", "compact", "queue"}
)
_LEADING_MENTION = re.compile(r"^\s*<@([A-Z0-9]+)(?:\|[^>]*)?>[\s:,]*")


def parse_event(payload: dict[str, Any], settings: Settings) -> InboundEvent | None:
    """The user message in an ``event_callback`` payload, or None for anything we ignore.

    We take direct messages (``message`` with ``channel_type == "im"``) and mentions in
    channels (``app_mention``); edits, joins and every other ``subtype``, bot messages and our
    own messages are ignored. The thread scope is the thread's root ``ts``; a mention outside a
    thread starts one on the mention itself (its ``ts``); a DM outside a thread is ``root``.
    """
    event = payload.get("event")
    if payload.get("type") != "event_callback" or not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind == "message":
        if event.get("channel_type") != "im":
            return None
    elif kind != "app_mention":
        return None
    if event.get("subtype") or event.get("bot_id") or event.get("bot_profile"):
        return None
    bot_user = settings.slack_bot_user_id or _authorized_user(payload)
    user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
    event_id = payload.get("event_id")
    if not (isinstance(user, str) and isinstance(channel, str) and isinstance(ts, str)
            and isinstance(event_id, str)) or user == bot_user:
        return None
    text = str(event.get("text") or "")
    if kind == "app_mention":
        m = _LEADING_MENTION.match(text)
        if m and (bot_user is None or m.group(1) == bot_user):
            text = text[m.end():]
    text = _unescape(text).strip()
    if not text:
        return None
    thread_ts = event.get("thread_ts")
    if isinstance(thread_ts, str) and thread_ts:
        scope = thread_ts
    else:
        scope = ts if kind == "app_mention" else "root"
    return InboundEvent(
        key=ConversationKey(channel="slack", chat_id=channel, thread_scope=scope),
        sender_id=user, text=text, dedupe_id=event_id, message_id=ts,
    )


def command_text(command: str, text: str) -> str:
    """A slash command as the chat message it stands for: ``/stop`` -> ``/stop``,
    ``/ultra`` + ``do X`` -> ``/ultra do X``, ``/fermix`` + ``new`` -> ``/new``; an umbrella
    command with anything else is a plain message, and with nothing is ``/help``."""
    name = command.strip().lstrip("/").lower()
    text = text.strip()
    if name in SLASH_COMMANDS:
        return f"/{name} {text}".strip()
    head, _, rest = text.partition(" ")
    sub = head.lstrip("/").lower()
    if sub in SLASH_COMMANDS:
        return f"/{sub} {rest.strip()}".strip()
    return text or "/help"


@router.post("/webhooks/slack/events")
async def slack_events(request: Request) -> JSONResponse:
    """Events API: URL verification, then one user message per callback."""
    body, refused = await _verified_body(request)
    if refused is not None:
        return refused
    try:
        payload = json.loads(body)
    except ValueError:
        return JSONResponse({"error": "body is not JSON"}, status_code=400)
    if not isinstance(payload, dict):
        return JSONResponse({"error": "body is not a JSON object"}, status_code=400)
    if payload.get("type") == "url_verification":
        return JSONResponse({"challenge": payload.get("challenge")})
    event = parse_event(payload, _settings(request))
    if event is None:
        log.debug("slack: ignored %s/%s", payload.get("type"),
                  (payload.get("event") or {}).get("type"))
        return JSONResponse({"ok": True})
    retry = request.headers.get("x-slack-retry-num")
    if retry:
        log.info("slack: retry %s of event %s", retry, event.dedupe_id)
    await receive(request, event)
    return JSONResponse({"ok": True})


@router.post("/webhooks/slack/commands")
async def slack_commands(request: Request) -> JSONResponse:
    """Slash commands (form-encoded): answered ephemerally with the command's reply."""
    body, refused = await _verified_body(request)
    if refused is not None:
        return refused
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    channel, user = form.get("channel_id", ""), form.get("user_id", "")
    trigger = form.get("trigger_id", "")
    if not (form.get("command") and channel and user and trigger):
        return JSONResponse({"error": "not a slash command"}, status_code=400)
    event = InboundEvent(
        key=ConversationKey(channel="slack", chat_id=channel, thread_scope="root"),
        sender_id=user, text=command_text(form["command"], form.get("text", "")),
        dedupe_id=trigger, message_id=trigger, answers_inline=True,
    )
    result = await receive(request, event)
    reply = result.reply
    return JSONResponse({"response_type": "ephemeral", "text": reply or "On it."})


async def _verified_body(request: Request) -> tuple[bytes, JSONResponse | None]:
    """The raw body if the request is signed by Slack within five minutes, else a refusal."""
    secret = _settings(request).slack_signing_secret
    if secret is None:
        return b"", JSONResponse({"error": "slack signing secret is not configured"},
                                 status_code=403)
    body = await request.body()
    timestamp = request.headers.get("x-slack-request-timestamp")
    signature = request.headers.get("x-slack-signature")
    try:
        valid = SignatureVerifier(secret.get_secret_value()).is_valid(body, timestamp, signature)
    except ValueError:  # a timestamp that is not a number
        valid = False
    if not valid:
        log.warning("slack: refused a request with an invalid or stale signature")
        return body, JSONResponse({"error": "invalid or stale Slack signature"}, status_code=401)
    return body, None


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _authorized_user(payload: dict[str, Any]) -> str | None:
    """Our bot's user id as Slack states it in the callback (``authorizations``)."""
    auths = payload.get("authorizations")
    if isinstance(auths, list) and auths and isinstance(auths[0], dict):
        user = auths[0].get("user_id")
        return user if isinstance(user, str) else None
    return None


def _unescape(text: str) -> str:
    """Slack sends ``&``, ``<``, ``>`` typed by the user as entities."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
