"""Slack webhooks: ``parse_event`` on payloads shaped like Slack's documented examples, and the
routes (signature, URL verification, events, slash commands) on a bare app with the router.

``receive`` (fermix_gateway/inbound.py: trust, commands, de-duplication, queueing) has its own
tests; here a stand-in records what the routes hand it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from fermix_gateway.webhooks import slack as slack_webhooks
from fermix_gateway.webhooks.slack import command_text, parse_event
from fermix_shared.channels.base import InboundEvent
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from tests.fakes.slack_api import sign

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BOT = "U0LAN0Z89"
SETTINGS = Settings(slack_signing_secret=SECRET, slack_bot_user_id=BOT)


def callback(event: dict[str, Any], event_id: str = "Ev0PV52K21") -> dict[str, Any]:
    return {
        "token": "XXYYZZ", "team_id": "T123ABC456", "api_app_id": "A123ABC456",
        "event": event, "type": "event_callback", "event_id": event_id,
        "event_time": 1355517523, "authorizations": [
            {"team_id": "T123ABC456", "user_id": BOT, "is_bot": True}],
    }


MESSAGE_IM = {"type": "message", "channel": "D024BE91L", "user": "U2147483697",
              "text": "Hello hello can you hear me?", "ts": "1355517523.000005",
              "event_ts": "1355517523.000005", "channel_type": "im"}
APP_MENTION = {"type": "app_mention", "user": "U061F7AUR",
               "text": f"<@{BOT}> is it everything a river should be?",
               "ts": "1515449522.000016", "channel": "C123ABC456",
               "event_ts": "1515449522000016"}


# -- parse_event ----------------------------------------------------------------------------

def test_a_direct_message_is_the_dm_root_conversation() -> None:
    assert parse_event(callback(MESSAGE_IM), SETTINGS) == InboundEvent(
        key=ConversationKey(channel="slack", chat_id="D024BE91L", thread_scope="root"),
        sender_id="U2147483697", text="Hello hello can you hear me?",
        dedupe_id="Ev0PV52K21", message_id="1355517523.000005",
    )


def test_a_direct_message_in_a_thread_is_that_thread() -> None:
    event = parse_event(callback({**MESSAGE_IM, "thread_ts": "1355517000.000001"}), SETTINGS)
    assert event is not None and event.key.thread_scope == "1355517000.000001"


def test_a_mention_in_a_channel_starts_a_thread_on_itself() -> None:
    event = parse_event(callback(APP_MENTION), SETTINGS)
    assert event is not None
    assert event.key == ConversationKey(channel="slack", chat_id="C123ABC456",
                                        thread_scope="1515449522.000016")
    assert event.text == "is it everything a river should be?"
    assert (event.sender_id, event.message_id) == ("U061F7AUR", "1515449522.000016")


def test_a_mention_inside_a_thread_belongs_to_the_thread() -> None:
    event = parse_event(callback({**APP_MENTION, "thread_ts": "1515449000.000001"}), SETTINGS)
    assert event is not None and event.key.thread_scope == "1515449000.000001"


def test_entities_are_decoded_and_only_our_leading_mention_is_stripped() -> None:
    text = f"<@{BOT}|fermix>: is 1 &lt; 2 &amp;&amp; ask <@U999>"
    event = parse_event(callback({**APP_MENTION, "text": text}), SETTINGS)
    assert event is not None and event.text == "is 1 < 2 && ask <@U999>"
    other = parse_event(callback({**APP_MENTION, "text": "<@U999> and <@U0LAN0Z89> hi"}), SETTINGS)
    assert other is not None and other.text == "<@U999> and <@U0LAN0Z89> hi"


@pytest.mark.parametrize("event", [
    {**MESSAGE_IM, "bot_id": "B123", "subtype": "bot_message", "user": None},
    {**MESSAGE_IM, "bot_id": "B123"},
    {"type": "message", "subtype": "message_changed", "channel": "D024BE91L",
     "hidden": True, "ts": "1358878755.000001", "channel_type": "im",
     "message": {"type": "message", "user": "U2147483697", "text": "Hello, world!",
                 "ts": "1355517523.000005", "edited": {"user": "U2147483697",
                                                       "ts": "1358878755.000001"}}},
    {**MESSAGE_IM, "subtype": "channel_join"},
    {**MESSAGE_IM, "user": BOT},  # our own message
    {**MESSAGE_IM, "channel_type": "channel"},  # channel chatter without a mention
    {**APP_MENTION, "text": f"<@{BOT}>"},  # nothing to answer
    {"type": "reaction_added", "user": "U1", "reaction": "eyes", "item": {}},
])
def test_events_we_do_not_answer(event: dict[str, Any]) -> None:
    assert parse_event(callback(event), SETTINGS) is None


def test_our_own_id_comes_from_the_payload_when_not_configured() -> None:
    settings = Settings(slack_signing_secret=SECRET)
    assert parse_event(callback({**MESSAGE_IM, "user": BOT}), settings) is None
    event = parse_event(callback(APP_MENTION), settings)
    assert event is not None and event.text == "is it everything a river should be?"


@pytest.mark.parametrize(("command", "text", "message"), [
    ("/stop", "", "/stop"),
    ("/ultra", "do X", "/ultra do X"),
    ("/new", "  ", "/new"),
    ("/fermix", "status", "/status"),
    ("/fermix", "/compact now", "/compact now"),
    ("/fermix", "what is 6*7", "what is 6*7"),
    ("/fermix", "", "/help"),
])
def test_slash_commands_become_chat_commands(command: str, text: str, message: str) -> None:
    assert command_text(command, text) == message


# -- routes ---------------------------------------------------------------------------------

@dataclass
class Result:
    kind: str
    reply: str | None = None


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[InboundEvent]:
    events: list[InboundEvent] = []

    async def stand_in(request: Request, event: InboundEvent) -> Result:
        events.append(event)
        return Result("command", "Nothing to stop.") if event.text == "/stop" else Result("queued")

    monkeypatch.setattr(slack_webhooks, "receive", stand_in)
    return events


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = FastAPI()
    app.include_router(slack_webhooks.router)
    app.state.settings = SETTINGS
    with TestClient(app) as c:
        yield c


def post_event(client: TestClient, payload: dict[str, Any], *, secret: str = SECRET,
               timestamp: int | None = None) -> Any:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **sign(body, secret, timestamp)}
    return client.post("/webhooks/slack/events", content=body, headers=headers)


def test_a_forged_signature_is_refused(client: TestClient, received: list[InboundEvent]) -> None:
    resp = post_event(client, callback(APP_MENTION), secret="not-the-secret")
    assert resp.status_code == 401
    assert resp.json() == {"error": "invalid or stale Slack signature"}
    unsigned = client.post("/webhooks/slack/events", json=callback(APP_MENTION))
    assert unsigned.status_code == 401
    assert received == []


def test_a_stale_signature_is_refused(client: TestClient, received: list[InboundEvent]) -> None:
    resp = post_event(client, callback(APP_MENTION), timestamp=int(time.time()) - 6 * 60)
    assert resp.status_code == 401
    assert received == []


def test_without_a_signing_secret_slack_is_off(received: list[InboundEvent]) -> None:
    app = FastAPI()
    app.include_router(slack_webhooks.router)
    app.state.settings = Settings(slack_signing_secret="")
    with TestClient(app) as c:
        resp = post_event(c, callback(APP_MENTION))
    assert resp.status_code == 403
    assert resp.json() == {"error": "slack signing secret is not configured"}


def test_url_verification_echoes_the_challenge(client: TestClient) -> None:
    challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    resp = post_event(client, {"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge,
                               "type": "url_verification"})
    assert resp.status_code == 200
    assert resp.json() == {"challenge": challenge}


def test_a_mention_is_received_once_in_a_thread_on_its_ts(
        client: TestClient, received: list[InboundEvent]) -> None:
    resp = post_event(client, callback(APP_MENTION))
    assert resp.status_code == 200
    [event] = received
    assert event.key == ConversationKey(channel="slack", chat_id="C123ABC456",
                                        thread_scope="1515449522.000016")
    assert event.dedupe_id == "Ev0PV52K21"


def test_a_bot_message_is_acknowledged_and_not_received(
        client: TestClient, received: list[InboundEvent]) -> None:
    resp = post_event(client, callback({**MESSAGE_IM, "bot_id": "B123", "subtype": "bot_message"}))
    assert resp.status_code == 200
    assert received == []


def test_a_slash_command_answers_ephemerally_with_the_reply(
        client: TestClient, received: list[InboundEvent]) -> None:
    form = {"token": "gIkuvaNzQIHg97ATvDxqgjtO", "team_id": "T0001", "channel_id": "C2147483705",
            "channel_name": "test", "user_id": "U2147483697", "user_name": "Steve",
            "command": "/stop", "text": "", "api_app_id": "A123456",
            "response_url": "https://hooks.slack.com/commands/1234/5678",
            "trigger_id": "13345224609.738474920.8088930838d88f008e0"}
    body = urlencode(form).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(body, SECRET)}
    resp = client.post("/webhooks/slack/commands", content=body, headers=headers)
    assert resp.status_code == 200
    assert resp.json() == {"response_type": "ephemeral", "text": "Nothing to stop."}
    [event] = received
    assert event.key == ConversationKey(channel="slack", chat_id="C2147483705")
    assert (event.sender_id, event.text) == ("U2147483697", "/stop")
    assert event.dedupe_id == event.message_id == form["trigger_id"]

    form |= {"command": "/ultra", "text": "audit the repo", "trigger_id": "2.3.4"}
    body = urlencode(form).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(body, SECRET)}
    resp = client.post("/webhooks/slack/commands", content=body, headers=headers)
    assert resp.json() == {"response_type": "ephemeral", "text": "On it."}
    assert received[-1].text == "/ultra audit the repo"


def test_a_slash_command_needs_a_signature(
        client: TestClient, received: list[InboundEvent]) -> None:
    body = urlencode({"command": "/stop", "channel_id": "C1", "user_id": "U1",
                      "trigger_id": "1.2.3"}).encode()
    resp = client.post("/webhooks/slack/commands", content=body,
                       headers={"Content-Type": "application/x-www-form-urlencoded",
                                **sign(body, SECRET, int(time.time()) - 600)})
    assert resp.status_code == 401
    assert received == []


# -- hostile bodies (issue 13: each of these was a 500, and the next request on the same
# connection was reset) --------------------------------------------------------------------

def post_raw(client: TestClient, route: str, body: bytes, content_type: str) -> Any:
    headers = {"Content-Type": content_type, **sign(body, SECRET)}
    return client.post(route, content=body, headers=headers)


@pytest.mark.parametrize(("body", "reason"), [
    (json.dumps({"type": "event_callback", "event_id": "Ev1", "event": [1, 2]}).encode(),
     "not a Slack event: event is not an object"),
    (json.dumps({"type": "event_callback", "event_id": "Ev1", "event": "message"}).encode(),
     "not a Slack event: event is not an object"),
    (b"[" * 10_000 + b"]" * 10_000, "body is JSON nested deeper than"),
    (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "body is JSON nested deeper than"),
    (b'{"type": "url_verification", "challenge": "\\ud800"}',
     "body holds a lone surrogate"),
    (b'{"type": "url_verification", "challenge": ["x"]}',
     "not a URL verification: challenge is not a string"),
    (b"\xff\xfe{}", "body is not UTF-8"),
    (json.dumps(callback({**MESSAGE_IM, "channel": "D0 24|x"})).encode(),
     "not a Slack event: channel"),
])
def test_a_signed_malformed_event_is_a_400_with_a_reason(
    client: TestClient, received: list[InboundEvent], body: bytes, reason: str
) -> None:
    resp = post_raw(client, "/webhooks/slack/events", body, "application/json")
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith(reason)
    assert received == []


@pytest.mark.parametrize(("body", "reason"), [
    (b"command=%2Fstop&channel_id=C1&user_id=U1&trigger_id=1.2&text=%ff",
     "body is not UTF-8"),
    (b"command=%2Fstop&channel_id=C1&user_id=U1&trigger_id=1.2&text=\xff", "body is not UTF-8"),
    (b"command=%2Fstop&channel_id=C+1%7Cx&user_id=U1&trigger_id=1.2", "not a slash command"),
])
def test_a_signed_malformed_slash_command_is_a_400_with_a_reason(
    client: TestClient, received: list[InboundEvent], body: bytes, reason: str
) -> None:
    resp = post_raw(client, "/webhooks/slack/commands", body,
                    "application/x-www-form-urlencoded")
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith(reason)
    assert received == []


@pytest.mark.parametrize(("signature", "timestamp"), [
    (b"v0=\xe9t\xe9", None),  # not ASCII: slack_sdk's compare_digest raised TypeError (a 500)
    (None, b"1e9"),
    (None, b"9" * 5000),
    (None, b"\xef\xbc\x91"),
])
def test_a_mangled_signature_or_timestamp_is_a_401(
    client: TestClient, received: list[InboundEvent], signature: bytes | None,
    timestamp: bytes | None,
) -> None:
    body = json.dumps(callback(APP_MENTION)).encode()
    headers: dict[str, Any] = {"Content-Type": "application/json", **sign(body, SECRET)}
    if signature is not None:
        headers["X-Slack-Signature"] = signature
    if timestamp is not None:
        headers["X-Slack-Request-Timestamp"] = timestamp
    resp = client.post("/webhooks/slack/events", content=body, headers=headers)
    assert resp.status_code == 401
    assert resp.json() == {"error": "invalid or stale Slack signature"}
    assert received == []
