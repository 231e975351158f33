"""POST /webhooks/telegram and the Update parser.

Payloads are shaped like the Bot API documentation's. The route tests run the real router in a
FastAPI app; only ``receive`` (trust, commands, queueing: tested with the inbound module) is
replaced by a stand-in that records the events it is given.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import ValidationError

from fermix_gateway.webhooks import telegram as webhook
from fermix_gateway.webhooks.telegram import parse_update
from fermix_shared.channels.base import InboundEvent
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from tests.fakes.telegram_api import FakeTelegram

BOT = "fermix_test_bot"
TOKEN = "123456:TEST-token_abc"
SECRET = "s3cret-Token_1"
ALICE = {"id": 111, "is_bot": False, "first_name": "Alice", "username": "alice"}
OUR_BOT = {"id": 123456, "is_bot": True, "first_name": "Fermix", "username": BOT}
PRIVATE = {"id": 111, "first_name": "Alice", "type": "private"}
GROUP = {"id": -1001234567890, "title": "Team", "type": "supergroup"}


def update(update_id: int = 10000, kind: str = "message", **message: Any) -> dict[str, Any]:
    body = {"message_id": 1365, "from": ALICE, "chat": PRIVATE, "date": 1441645532, **message}
    return {"update_id": update_id, kind: body}


@pytest.fixture
def settings() -> Settings:
    return Settings(telegram_bot_token=TOKEN, telegram_webhook_secret=SECRET,
                    telegram_bot_username=BOT)


def test_private_text() -> None:
    event = parse_update(update(text="/start"), Settings(telegram_bot_username=BOT))
    assert event == InboundEvent(
        key=ConversationKey(channel="telegram", chat_id="111", thread_scope="root"),
        sender_id="111", text="/start", dedupe_id="10000", message_id="1365", bot_name=BOT,
    )


def test_caption_on_a_photo(settings: Settings) -> None:
    photo = [{"file_id": "AgAD", "file_unique_id": "AQAD", "width": 90, "height": 51}]
    event = parse_update(update(photo=photo, caption="what is this?"), settings)
    assert event is not None and event.text == "what is this?"


def test_group_mention_is_answered_without_the_mention(settings: Settings) -> None:
    event = parse_update(update(chat=GROUP, text=f"@{BOT}, what is 6*7?"), settings)
    assert event is not None
    assert event.text == "what is 6*7?"
    assert event.key == ConversationKey(channel="telegram", chat_id="-1001234567890")


def test_group_without_mention_is_ignored(settings: Settings) -> None:
    assert parse_update(update(chat=GROUP, text="lunch anyone?"), settings) is None
    assert parse_update(update(chat=GROUP, text=f"ask @{BOT}x"), settings) is None
    relaxed = settings.model_copy(update={"telegram_group_mention_only": False})
    assert parse_update(update(chat=GROUP, text="lunch anyone?"), relaxed) is not None


def test_group_reply_to_the_bot_and_commands_are_answered(settings: Settings) -> None:
    replied = {"message_id": 1300, "from": OUR_BOT, "chat": GROUP, "date": 1, "text": "42"}
    event = parse_update(update(chat=GROUP, text="why?", reply_to_message=replied), settings)
    assert event is not None and event.text == "why?"
    # Known by the token's bot id too, when no username is configured.
    anonymous = settings.model_copy(update={"telegram_bot_username": None})
    assert parse_update(update(chat=GROUP, text="why?", reply_to_message=replied),
                        anonymous) is not None
    to_alice = {**replied, "from": ALICE}
    assert parse_update(update(chat=GROUP, text="why?", reply_to_message=to_alice),
                        settings) is None
    for text in ("/stop", f"/stop@{BOT}", f"/stop@{BOT.upper()} now"):
        event = parse_update(update(chat=GROUP, text=text), settings)
        assert event is not None and event.text == text


def test_forum_topic_message_is_scoped_to_its_topic(settings: Settings) -> None:
    event = parse_update(update(chat={**GROUP, "is_forum": True}, text=f"@{BOT} hi",
                                message_thread_id=42, is_topic_message=True), settings)
    assert event is not None
    assert event.key == ConversationKey(channel="telegram", chat_id="-1001234567890",
                                        thread_scope="42")
    # A reply thread in a plain group is not a topic.
    event = parse_update(update(chat=GROUP, text=f"@{BOT} hi", message_thread_id=7), settings)
    assert event is not None and event.key.thread_scope == "root"


@pytest.mark.parametrize("payload", [
    update(text="/start@otherbot"),
    update(chat=GROUP, text="/start@otherbot"),
    update(kind="edited_message", text="fixed typo", edit_date=1441645600),
    update(**{"from": {**OUR_BOT, "id": 999, "username": "some_bot"}}, text="beep"),
    update(sticker={"file_id": "CAAD", "width": 512, "height": 512}),
    update(text="   "),
    {"update_id": 10001, "callback_query": {"id": "4382", "from": ALICE, "data": "x"}},
    {"update_id": 10002, "my_chat_member": {"chat": GROUP, "from": ALICE, "date": 1}},
])
def test_updates_we_do_not_answer(payload: dict[str, Any], settings: Settings) -> None:
    assert parse_update(payload, settings) is None


def test_malformed_updates_raise(settings: Settings) -> None:
    with pytest.raises(ValidationError):
        parse_update({"message": {"text": "hi"}}, settings)
    with pytest.raises(ValidationError):
        parse_update({"update_id": 1, "message": {"message_id": 2, "text": "no chat"}}, settings)


# --- the route ---------------------------------------------------------------------------


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[InboundEvent]:
    events: list[InboundEvent] = []

    async def receive(request: Request, event: InboundEvent) -> None:
        events.append(event)

    monkeypatch.setattr(webhook, "receive", receive)
    return events


def client_for(settings: Settings) -> TestClient:
    app = FastAPI()
    app.state.settings = settings
    app.include_router(webhook.router)
    return TestClient(app)


def post(client: TestClient, body: Any, secret: str | None = SECRET) -> Any:
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret is not None else {}
    if isinstance(body, bytes):
        return client.post("/webhooks/telegram", content=body, headers=headers)
    return client.post("/webhooks/telegram", json=body, headers=headers)


def test_a_valid_update_is_received_once_and_acknowledged(
    settings: Settings, received: list[InboundEvent]
) -> None:
    resp = post(client_for(settings), update(update_id=555, text="hello"))
    assert resp.status_code == 200
    assert resp.json() == {"ok": True}
    assert received == [InboundEvent(
        key=ConversationKey(channel="telegram", chat_id="111"), sender_id="111", text="hello",
        dedupe_id="555", message_id="1365", bot_name=BOT,
    )]


@pytest.mark.parametrize("secret", [None, "", "wrong-secret", SECRET + "x", "s3cret-token_1"])
def test_a_missing_or_forged_secret_is_refused(
    settings: Settings, received: list[InboundEvent], secret: str | None
) -> None:
    resp = post(client_for(settings), update(text="hello"), secret=secret)
    assert resp.status_code == 401
    assert received == []


def test_an_unconfigured_secret_refuses_everything(
    settings: Settings, received: list[InboundEvent]
) -> None:
    unsigned = settings.model_copy(update={"telegram_webhook_secret": None})
    resp = post(client_for(unsigned), update(text="hello"))
    assert resp.status_code == 403
    assert resp.json() == {"error": "telegram webhook secret is not configured"}
    assert received == []


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "body is not JSON"),
    ([1, 2], "body is not a JSON object"),
    ({"update_id": "abc", "message": {}}, "not a Telegram update: update_id"),
])
def test_garbage_is_a_400_with_a_reason(
    settings: Settings, received: list[InboundEvent], body: Any, reason: str
) -> None:
    resp = post(client_for(settings), body)
    assert resp.status_code == 400
    assert resp.json()["error"].startswith(reason)
    assert received == []


def test_ignored_updates_are_acknowledged(
    settings: Settings, received: list[InboundEvent]
) -> None:
    client = client_for(settings)
    resp = post(client, update(kind="edited_message", text="fixed"))
    assert (resp.status_code, resp.json()) == (200, {"ok": True})
    resp = post(client, update(chat=GROUP, text="chatter"))
    assert (resp.status_code, resp.json()) == (200, {"ok": True})
    assert received == []


def test_the_bot_username_is_looked_up_once_when_not_configured(
    received: list[InboundEvent]
) -> None:
    with FakeTelegram(TOKEN, bot_username=BOT) as fake:
        settings = Settings(telegram_bot_token=TOKEN, telegram_webhook_secret=SECRET,
                            telegram_api_base=fake.url)
        client = client_for(settings)
        assert post(client, update(update_id=1, chat=GROUP, text=f"@{BOT} hi")).status_code == 200
        assert post(client, update(update_id=2, chat=GROUP, text=f"@{BOT} again")).status_code == 200
        assert [e.text for e in received] == ["hi", "again"]
        assert received[0].bot_name == BOT
        assert len(fake.calls("getMe")) == 1


@pytest.mark.parametrize(("body", "reason"), [
    # issue 13: each of these was a 500 (RecursionError, UnicodeEncodeError)
    (b"[" * 10_000 + b"]" * 10_000, "body is JSON nested deeper than"),
    (b'{"update_id": 1, "x": ' + b"[" * 900 + b"]" * 900 + b"}",
     "body is JSON nested deeper than"),
    (b'{"update_id": 1, "message": {"message_id": 1, "from": {"id": 111}, '
     b'"chat": {"id": 111, "type": "private"}, "text": "hi \\ud800"}}',
     "body holds a lone surrogate"),
    (b'\xff\xfe{"update_id": 1}', "body is not UTF-8"),
])
def test_hostile_bodies_are_a_400_with_a_reason(
    settings: Settings, received: list[InboundEvent], body: bytes, reason: str
) -> None:
    resp = post(client_for(settings), body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith(reason)
    assert received == []
