"""Slack webhooks: the Events API, slash commands and interactivity (approval buttons).

Every request must carry a valid ``v0`` signature (HMAC-SHA256 of ``v0:{timestamp}:{body}``
with the app's signing secret) no older than five minutes; anything else is refused with 401
before it is parsed. A signed body that cannot be Slack's is refused with 400 and the reason
(:mod:`fermix_gateway.bodies`), never a 500. Accepted messages go through
:func:`fermix_gateway.inbound.receive` (trust, commands, durable de-duplication by Slack's
``event_id``, queueing), so a Slack retry (``X-Slack-Retry-Num``) is harmless. Slack wants an
answer within 3 s: nothing slow runs here.

``POST /webhooks/slack/interactions`` is the app's Interactivity Request URL: a press of our
Approve / Deny buttons (``block_actions``, action ids ``fx_approve`` / ``fx_deny``) is answered
by :func:`fermix_gateway.webhooks.buttons.press` (owners only, de-duplicated by
``trigger_id``) and the outcome is said in the question's thread through a worker; a refusal
(a guest's press, a stranger's first of the hour) is shown to the presser alone
(``chat.postEphemeral``), never posted into the channel. The HTTP answer is an empty 200.
Every other interaction is acknowledged and ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fermix_gateway.bodies import MalformedBody, is_id, json_object, utf8
from fermix_gateway.inbound import receive, reply_in_chat, task_sender
from fermix_gateway.webhooks.buttons import press
from fermix_shared.approvals.buttons import SLACK_ACTIONS
from fermix_shared.channels.base import ApprovalPress, InboundEvent
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from fermix_shared.task_names import PRIVATE_SEND_TASK

log = logging.getLogger(__name__)
router = APIRouter()

# Slash commands registered one by one (``/stop``) map to ``/stop``; any other command name is
# an umbrella (``/fermix stop``, ``/fermix what is 6*7``).
SLASH_COMMANDS = frozenset(
    {"stop", "new", "reset", "status", "help", "whoami", "ultra", "clear", "compact", "queue"}
)
_LEADING_MENTION = re.compile(r"^\s*<@([A-Z0-9]+)(?:\|[^>]*)?>[\s:,]*")
# A signature older (or newer) than this is refused: Slack's replay window.
MAX_SIGNATURE_AGE_SECONDS = 5 * 60
# Slash command forms have about a dozen fields.
_MAX_FORM_FIELDS = 100


def parse_event(payload: dict[str, Any], settings: Settings) -> InboundEvent | None:
    """The user message in an ``event_callback`` payload, or None for anything we ignore.

    We take direct messages (``message`` with ``channel_type == "im"``) and mentions in
    channels (``app_mention``); edits, joins and every other ``subtype``, bot messages and our
    own messages are ignored. The thread scope is the thread's root ``ts``; a mention outside a
    thread starts one on the mention itself (its ``ts``); a DM outside a thread is ``root``.
    Raises :class:`MalformedBody` for a callback Slack cannot have sent (an ``event`` that is
    not an object, ids that are not Slack ids).
    """
    if payload.get("type") != "event_callback":
        return None
    event = payload.get("event")
    if not isinstance(event, dict):
        raise MalformedBody("not a Slack event: event is not an object")
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
    thread_ts = event.get("thread_ts")
    for name, value in (("event_id", event_id), ("channel", channel), ("user", user),
                        ("ts", ts), ("thread_ts", thread_ts or "-")):
        if not is_id(value):
            raise MalformedBody(f"not a Slack event: {name} is not a Slack id")
    text = event.get("text")
    text = text if isinstance(text, str) else ""
    if kind == "app_mention":
        m = _LEADING_MENTION.match(text)
        if m and (bot_user is None or m.group(1) == bot_user):
            text = text[m.end():]
    text = _unescape(text).strip()
    if not text:
        return None
    scope = str(thread_ts or (ts if kind == "app_mention" else "root"))
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
        payload = json_object(body)
        if payload.get("type") == "url_verification":
            challenge = payload.get("challenge")
            if not isinstance(challenge, str):
                raise MalformedBody("not a URL verification: challenge is not a string")
            return JSONResponse({"challenge": challenge})
        event = parse_event(payload, _settings(request))
    except MalformedBody as e:
        log.warning("slack: refused a signed event: %s", e)
        return JSONResponse({"error": str(e)}, status_code=400)
    if event is None:
        log.debug("slack: ignored a callback of type %.40r", payload.get("type"))
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
    try:
        form = _form(body)
    except MalformedBody as e:
        log.warning("slack: refused a signed slash command: %s", e)
        return JSONResponse({"error": str(e)}, status_code=400)
    channel, user = form.get("channel_id", ""), form.get("user_id", "")
    trigger = form.get("trigger_id", "")
    if not (form.get("command") and is_id(channel) and is_id(user) and is_id(trigger)):
        return JSONResponse({"error": "not a slash command: command, channel_id, user_id and "
                                      "trigger_id are required Slack ids"}, status_code=400)
    event = InboundEvent(
        key=ConversationKey(channel="slack", chat_id=channel, thread_scope="root"),
        sender_id=user, text=command_text(form["command"], form.get("text", "")),
        dedupe_id=trigger, message_id=trigger, answers_inline=True,
    )
    result = await receive(request, event)
    reply = result.reply
    return JSONResponse({"response_type": "ephemeral", "text": reply or "On it."})


def _form(body: bytes) -> dict[str, str]:
    """A form-encoded body, strictly UTF-8 (raw and percent-encoded bytes alike)."""
    text = utf8(body)
    try:
        fields = parse_qs(text, errors="strict", max_num_fields=_MAX_FORM_FIELDS)
    except UnicodeDecodeError as e:
        raise MalformedBody(f"body is not UTF-8 once percent-decoded (byte {e.start})") from None
    except ValueError:
        raise MalformedBody(f"body has more than {_MAX_FORM_FIELDS} form fields") from None
    return {k: v[0] for k, v in fields.items()}


def parse_interaction(payload: dict[str, Any]) -> ApprovalPress | None:
    """The press of an approval button in an interaction payload, or None for anything else
    (other interaction types, other buttons).

    The conversation is the question's channel and thread (the message's ``thread_ts``; a
    question posted outside any thread, in a DM, is ``root``), as the Slack adapter keys it.
    The delivery id is the ``trigger_id`` (else the action's ``action_ts``). Raises
    :class:`MalformedBody` for a payload Slack cannot have sent.
    """
    if payload.get("type") != "block_actions":
        return None
    actions = payload.get("actions")
    if not isinstance(actions, list):
        raise MalformedBody("not a block action: actions is not a list")
    action = next((a for a in actions if isinstance(a, dict)
                   and isinstance(a.get("action_id"), str) and a["action_id"] in SLACK_ACTIONS),
                  None)
    if action is None:
        return None
    user, container = _object(payload, "user"), _object(payload, "container")
    message, channel = _object(payload, "message"), _object(payload, "channel")
    user_id = user.get("id")
    channel_id = container.get("channel_id") or channel.get("id")
    thread_ts = message.get("thread_ts") or container.get("thread_ts")
    delivery = payload.get("trigger_id") or action.get("action_ts")
    value = action.get("value")
    for name, v in (("user.id", user_id), ("channel", channel_id), ("trigger_id", delivery),
                    ("value", value), ("thread_ts", thread_ts or "-")):
        if not is_id(v):
            raise MalformedBody(f"not a block action: {name} is not a Slack id")
    return ApprovalPress(
        channel="slack", sender_id=str(user_id), approval_id=str(value),
        decision=SLACK_ACTIONS[str(action["action_id"])], dedupe_id=str(delivery),
        key=ConversationKey(channel="slack", chat_id=str(channel_id),
                            thread_scope=str(thread_ts or "root")),
    )


@router.post("/webhooks/slack/interactions")
async def slack_interactions(request: Request) -> Response:
    """Interactivity (form-encoded ``payload=<json>``): presses of our approval buttons."""
    body, refused = await _verified_body(request)
    if refused is not None:
        return refused
    try:
        form = _form(body)
        if "payload" not in form:
            raise MalformedBody("not an interaction: no payload field")
        pressed = parse_interaction(json_object(form["payload"].encode()))
    except MalformedBody as e:
        log.warning("slack: refused a signed interaction: %s", e)
        return JSONResponse({"error": str(e)}, status_code=400)
    if pressed is None:
        log.debug("slack: ignored an interaction")
        return Response(status_code=200)
    retry = request.headers.get("x-slack-retry-num")
    if retry:
        log.info("slack: retry %s of interaction %s", retry, pressed.dedupe_id)
    outcome = await press(request, pressed)
    # Slack shows the presser nothing from our HTTP answer: an owner's outcome is said in the
    # thread; a refusal (a guest's, a stranger's first press of the hour) only to the presser,
    # as an ephemeral message; a redelivery gets no word.
    if pressed.key is None:
        return Response(status_code=200)
    if outcome.kind in ("decided", "answered"):
        await reply_in_chat(request, pressed.key, outcome.text,
                            f"button:slack:{pressed.dedupe_id}")
    elif outcome.kind in ("refused", "stranger") and outcome.tell:
        await send_private(request, pressed.key, pressed.sender_id, outcome.text)
    return Response(status_code=200)


async def send_private(request: Request, key: ConversationKey, user_id: str, text: str) -> None:
    """Show ``text`` to ``user_id`` alone (``chat.postEphemeral``, through a worker)."""
    await task_sender(request)(PRIVATE_SEND_TASK, [key.as_str(), user_id, text])


def _object(payload: dict[str, Any], name: str) -> dict[str, Any]:
    value = payload.get(name)
    return value if isinstance(value, dict) else {}


def signature_valid(secret: str, body: bytes, timestamp: str | None, signature: str | None,
                    now: float | None = None) -> bool:
    """Slack's ``v0`` check over the raw bytes. (slack_sdk's ``SignatureVerifier`` decodes the
    body as UTF-8 and compares ``str``s, which raises on a non-UTF-8 body or a non-ASCII
    header: a 500 for what is only a bad signature.)"""
    if timestamp is None or signature is None:
        return False
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        return False
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > MAX_SIGNATURE_AGE_SECONDS:
        return False
    key = secret.encode("utf-8", "surrogateescape")
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(key, base, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogateescape"))


async def _verified_body(request: Request) -> tuple[bytes, JSONResponse | None]:
    """The raw body if the request is signed by Slack within five minutes, else a refusal."""
    secret = _settings(request).slack_signing_secret
    if secret is None:
        return b"", JSONResponse({"error": "slack signing secret is not configured"},
                                 status_code=403)
    body = await request.body()
    timestamp = request.headers.get("x-slack-request-timestamp")
    signature = request.headers.get("x-slack-signature")
    if not signature_valid(secret.get_secret_value(), body, timestamp, signature):
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
