"""Approval buttons pressed (issue 15, item 7): Telegram ``callback_query`` updates on
``POST /webhooks/telegram`` and Slack ``block_actions`` on ``POST /webhooks/slack/interactions``,
through the real app on a real Redis (tests/gateway/inprocess.py), each answering an approval
set up with the store's own ``ask``.

What a person notices: the owner's press decides the approval and the parked turn resumes
(``fermix.approvals.resume`` is sent with its id); Telegram shows the outcome on the button
at once (the webhook's reply is an ``answerCallbackQuery``) and the chat is told; a guest is
refused and nothing changes; a second press is told it was already answered; a redelivered
press decides nothing; forged or garbled requests get a 4xx, never a 5xx.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix_gateway.app import create_app
from fermix_gateway.approval_answers import GUEST_REFUSAL
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import ConversationKey
from fermix_shared.task_names import APPROVAL_RESUME_TASK, PRIVATE_SEND_TASK
from tests.fakes.slack_api import sign
from tests.gateway.inprocess import (
    SEND_TASK,
    SLACK_BOT,
    SLACK_OWNER,
    SLACK_SECRET,
    TG_BOT,
    TG_OWNER,
    RecordingCelery,
    flushed,
    settings_for,
    slack_headers,
    telegram_headers,
)
from tests.gateway.test_fuzz import (
    HOSTILE_VALUES,
    as_json,
    field_paths,
    json_values,
    replaced,
)

TG_GUEST, SLACK_GUEST = 222, "U0GUEST"
FORM = "application/x-www-form-urlencoded"
GROUP = -1001234567890
THREAD_TS = "1712345678.000200"
TRIGGER = "13345224609.738474920.8088930838d88f008e0"


@contextmanager
def gateway(redis_url: str) -> Iterator[tuple[TestClient, RecordingCelery]]:
    """inprocess.gateway's app, with a guest on each platform."""
    settings = settings_for(redis_url).model_copy(
        update={"allowed_ids": [f"telegram:{TG_GUEST}", f"slack:{SLACK_GUEST}"]})
    app = create_app(settings, hooks=HookRegistry())
    celery = RecordingCelery()
    app.state.tasks = celery
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, celery


def pending(r: redis.Redis, key: ConversationKey, tool: str = "shell") -> str:
    """A pending approval asked in ``key``, as the worker records it."""
    approval_id = approvals.new_approval_id()
    now = time.time()
    approvals.ask(r, ApprovalRequest(
        approval_id=approval_id, conv=key.as_str(), run_id="run_parked", call_id="call_1",
        tool=tool, arguments={"cmd": "rm -rf build"}, requester=f"{key.channel}:owner",
        ask_in=key, requested_at=now, expires_at=now + 600,
    ))
    return approval_id


def status(r: redis.Redis, approval_id: str) -> tuple[str, str | None]:
    found = approvals.get(r, approval_id)
    assert found is not None
    return found.status, found.decided_by


# --- Telegram ----------------------------------------------------------------------------------

TG_PRIVATE = ConversationKey(channel="telegram", chat_id=str(TG_OWNER))


def tg_press(update_id: int, data: Any, user: int = TG_OWNER, chat: int = TG_OWNER,
             topic: int | None = None) -> dict[str, Any]:
    """A callback_query Update as Telegram sends it for a press under our question."""
    message: dict[str, Any] = {
        "message_id": 900, "date": 1712345678, "text": "Approval needed ...",
        "from": {"id": 123456, "is_bot": True, "first_name": "Fermix", "username": TG_BOT},
        "chat": {"id": chat, "type": "private" if chat > 0 else "supergroup"},
    }
    if topic is not None:
        message |= {"message_thread_id": topic, "is_topic_message": True}
    return {"update_id": update_id, "callback_query": {
        "id": f"4382{update_id}", "chat_instance": "-8839913021",
        "from": {"id": user, "is_bot": False, "first_name": "Presser"},
        "message": message, "data": data,
    }}


def post_tg(client: TestClient, body: Any) -> Any:
    return client.post("/webhooks/telegram", headers=telegram_headers(), json=body)


def test_the_owner_pressing_approve_approves_resumes_and_answers_the_callback(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, TG_PRIVATE)
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, tg_press(70001, f"fx:approve:{approval_id}"))
    assert resp.status_code == 200
    assert resp.json() == {"method": "answerCallbackQuery", "callback_query_id": "438270001",
                           "text": f"Approved {approval_id}: shell will run now."}
    assert status(r, approval_id) == ("approved", f"telegram:{TG_OWNER}")
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert celery.named(SEND_TASK) == [[TG_PRIVATE.as_str(),
                                        f"Approved {approval_id}: `shell` will run now.",
                                        "button:telegram:70001"]]


def test_deny_in_a_forum_topic_is_told_in_that_topic(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    topic = ConversationKey(channel="telegram", chat_id=str(GROUP), thread_scope="42")
    approval_id = pending(r, topic)
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, tg_press(70002, f"fx:deny:{approval_id}", chat=GROUP, topic=42))
    assert resp.json()["text"] == f"Denied {approval_id}: shell will not run."
    assert status(r, approval_id) == ("denied", f"telegram:{TG_OWNER}")
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert [args[0] for args in celery.named(SEND_TASK)] == ["telegram|-1001234567890|42"]


@pytest.mark.parametrize("user", [TG_GUEST, 999])  # a guest, and someone not allowed at all
def test_only_the_owner_may_press(r: redis.Redis, scratch_redis_url: str, user: int) -> None:
    approval_id = pending(r, TG_PRIVATE)
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, tg_press(70003, f"fx:approve:{approval_id}", user=user))
    assert resp.json() == {"method": "answerCallbackQuery", "callback_query_id": "438270003",
                           "text": GUEST_REFUSAL}
    assert status(r, approval_id) == ("pending", None)
    assert celery.sent == []  # no resume, and nothing said in the chat


def test_a_second_press_is_told_it_was_already_answered(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, TG_PRIVATE)
    with gateway(scratch_redis_url) as (client, celery):
        post_tg(client, tg_press(70004, f"fx:approve:{approval_id}"))
        resp = post_tg(client, tg_press(70005, f"fx:deny:{approval_id}"))
    assert resp.json()["text"] == (f"Approval {approval_id} was already answered: "
                                   f"approved by telegram:{TG_OWNER}.")
    assert status(r, approval_id) == ("approved", f"telegram:{TG_OWNER}")
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert len(celery.named(SEND_TASK)) == 1  # only the decision was said in the chat


def test_a_redelivered_press_decides_nothing_and_says_where_things_stand(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, TG_PRIVATE)
    with gateway(scratch_redis_url) as (client, celery):
        post_tg(client, tg_press(70006, f"fx:approve:{approval_id}"))
        resp = post_tg(client, tg_press(70006, f"fx:approve:{approval_id}"))
    assert resp.json()["text"] == (f"Approval {approval_id} was approved by "
                                   f"telegram:{TG_OWNER}.")
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert len(celery.named(SEND_TASK)) == 1


def test_a_press_on_an_unknown_approval_is_told_so(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, tg_press(70007, "fx:approve:0badcafe"))
    assert resp.json()["text"] == "No approval with id 0badcafe."
    assert celery.sent == []


@pytest.mark.parametrize("data", ["something-else", "fx:approve:ZZZZZZZZ",
                                  "fx:launch:0badcafe", "fx:approve:0badcafe:x", None])
def test_other_buttons_are_acknowledged_and_ignored(
    r: redis.Redis, scratch_redis_url: str, data: str | None
) -> None:
    approval_id = pending(r, TG_PRIVATE)
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, tg_press(70008, data))
    assert (resp.status_code, resp.json()) == (
        200, {"method": "answerCallbackQuery", "callback_query_id": "438270008"})
    assert status(r, approval_id) == ("pending", None)
    assert celery.sent == []


def test_a_press_without_the_secret_is_refused(r: redis.Redis, scratch_redis_url: str) -> None:
    approval_id = pending(r, TG_PRIVATE)
    with gateway(scratch_redis_url) as (client, celery):
        resp = client.post("/webhooks/telegram", json=tg_press(70009, f"fx:approve:{approval_id}"),
                           headers={"X-Telegram-Bot-Api-Secret-Token": "forged"})
    assert resp.status_code == 401
    assert status(r, approval_id) == ("pending", None)
    assert celery.sent == []


def _without(body: dict[str, Any], *path: str) -> dict[str, Any]:
    node = body
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return body


@pytest.mark.parametrize(("body", "reason"), [
    ({"update_id": 1, "callback_query": [1]}, "not a Telegram update: callback_query"),
    (_without(tg_press(1, "fx:approve:0badcafe"), "callback_query", "from"),
     "not a Telegram update: callback_query.from"),
    ({**tg_press(1, "x"), "callback_query": {**tg_press(1, "x")["callback_query"], "id": 5}},
     "not a Telegram update: callback_query.id"),
    (tg_press(1, ["fx:approve:0badcafe"]), "not a Telegram update: callback_query.data"),
    (_without(tg_press(1, "fx:approve:0badcafe"), "callback_query", "message", "chat"),
     "not a Telegram update: callback_query.message.chat"),
    ({"update_id": "x", **{k: v for k, v in tg_press(1, "x").items() if k != "update_id"}},
     "not a Telegram update: update_id"),
])
def test_a_malformed_press_is_a_400_with_a_reason(
    r: redis.Redis, scratch_redis_url: str, body: dict[str, Any], reason: str
) -> None:
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith(reason)
    assert celery.sent == []


def test_a_press_under_an_inaccessible_message_is_answered_without_a_chat_post(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, TG_PRIVATE)
    body = tg_press(70010, f"fx:approve:{approval_id}")
    body["callback_query"]["message"] = {"chat": {"id": TG_OWNER, "type": "private"},
                                         "message_id": 900, "date": 0}
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, body)
    assert resp.json()["text"] == f"Approved {approval_id}: shell will run now."
    assert celery.named(SEND_TASK) == [[TG_PRIVATE.as_str(),
                                        f"Approved {approval_id}: `shell` will run now.",
                                        "button:telegram:70010"]]
    del body["callback_query"]["message"]  # an inline message: no chat to tell
    body["update_id"] = 70011
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_tg(client, body)
    assert resp.json()["text"].startswith(f"Approval {approval_id} was already answered")
    assert celery.sent == []


# --- Slack -------------------------------------------------------------------------------------

SLACK_THREAD = ConversationKey(channel="slack", chat_id="C0123CHAN", thread_scope=THREAD_TS)
SLACK_DM = ConversationKey(channel="slack", chat_id="D0456DM")


def block_actions(action_id: str, value: Any, *, user: str = SLACK_OWNER,
                  trigger: str = TRIGGER, key: ConversationKey = SLACK_THREAD) -> dict[str, Any]:
    """A block_actions payload as Slack sends it for a press under our question."""
    thread = {} if key.thread_scope == "root" else {"thread_ts": key.thread_scope}
    message = {"type": "message", "user": SLACK_BOT, "bot_id": "B0BOT", "ts": "1712345679.000300",
               "text": "Approval needed ...", **thread}
    return {
        "type": "block_actions", "api_app_id": "A0APP", "token": "deprecated",
        "user": {"id": user, "username": "someone", "name": "someone", "team_id": "T0TEAM"},
        "team": {"id": "T0TEAM", "domain": "example"},
        "container": {"type": "message", "message_ts": message["ts"], "channel_id": key.chat_id,
                      "is_ephemeral": False, **thread},
        "trigger_id": trigger, "channel": {"id": key.chat_id, "name": "ops"},
        "message": message, "response_url": "https://hooks.slack.com/actions/T0TEAM/1/x",
        "actions": [{"action_id": action_id, "block_id": "fx_approval", "type": "button",
                     "text": {"type": "plain_text", "text": "Approve"}, "value": value,
                     "style": "primary", "action_ts": "1712345690.123456"}],
    }


def form(payload: Any) -> bytes:
    return urlencode({"payload": json.dumps(payload)}).encode()


def post_slack(client: TestClient, body: bytes, **headers: str) -> Any:
    return client.post("/webhooks/slack/interactions", content=body,
                       headers={**slack_headers(body, FORM), **headers})


def test_the_owner_pressing_approve_in_slack_approves_and_says_so_in_the_thread(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, SLACK_THREAD)
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_slack(client, form(block_actions("fx_approve", approval_id)))
    assert (resp.status_code, resp.content) == (200, b"")
    assert status(r, approval_id) == ("approved", f"slack:{SLACK_OWNER}")
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert celery.named(SEND_TASK) == [[f"slack|C0123CHAN|{THREAD_TS}",
                                        f"Approved {approval_id}: `shell` will run now.",
                                        f"button:slack:{TRIGGER}"]]


def test_deny_in_a_slack_dm_is_told_in_the_dm(r: redis.Redis, scratch_redis_url: str) -> None:
    approval_id = pending(r, SLACK_DM)
    with gateway(scratch_redis_url) as (client, celery):
        post_slack(client, form(block_actions("fx_deny", approval_id, key=SLACK_DM)))
    assert status(r, approval_id) == ("denied", f"slack:{SLACK_OWNER}")
    assert celery.named(SEND_TASK)[0][:2] == ["slack|D0456DM|root",
                                             f"Denied {approval_id}: `shell` will not run."]


def test_a_forged_slack_press_is_a_401(r: redis.Redis, scratch_redis_url: str) -> None:
    approval_id = pending(r, SLACK_THREAD)
    body = form(block_actions("fx_approve", approval_id))
    with gateway(scratch_redis_url) as (client, celery):
        forged = client.post("/webhooks/slack/interactions", content=body,
                             headers={"Content-Type": FORM, **sign(body, "not-the-secret")})
        stale = client.post("/webhooks/slack/interactions", content=body,
                            headers={"Content-Type": FORM,
                                     **sign(body, SLACK_SECRET, int(time.time()) - 600)})
    assert (forged.status_code, forged.json()) == (401, {"error": "invalid or stale Slack signature"})
    assert stale.status_code == 401
    assert status(r, approval_id) == ("pending", None)
    assert celery.sent == []


def test_a_replayed_slack_press_decides_nothing_more(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, SLACK_THREAD)
    body = form(block_actions("fx_approve", approval_id))
    with gateway(scratch_redis_url) as (client, celery):
        assert post_slack(client, body).status_code == 200
        retried = post_slack(client, body, **{"X-Slack-Retry-Num": "1",
                                              "X-Slack-Retry-Reason": "http_timeout"})
        # Even a replay that would flip the answer is the same delivery: nothing changes.
        flipped = post_slack(client, form(block_actions("fx_deny", approval_id)))
    assert (retried.status_code, flipped.status_code) == (200, 200)
    assert status(r, approval_id) == ("approved", f"slack:{SLACK_OWNER}")
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert len(celery.named(SEND_TASK)) == 1


def test_a_second_slack_press_is_told_in_the_thread_it_was_already_answered(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    approval_id = pending(r, SLACK_THREAD)
    with gateway(scratch_redis_url) as (client, celery):
        post_slack(client, form(block_actions("fx_approve", approval_id)))
        post_slack(client, form(block_actions("fx_deny", approval_id, trigger="2.3.4")))
    assert celery.named(APPROVAL_RESUME_TASK) == [[approval_id]]
    assert celery.named(SEND_TASK)[1] == [
        f"slack|C0123CHAN|{THREAD_TS}",
        f"Approval {approval_id} was already answered: approved by slack:{SLACK_OWNER}.",
        "button:slack:2.3.4"]


def test_a_slack_guest_or_stranger_is_refused_privately_not_in_the_thread(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    """Issue 25 item 13: the refusal went into the channel for everyone to see. Now it is an
    ephemeral message to the presser alone; a stranger is told once an hour, however often
    they press."""
    approval_id = pending(r, SLACK_THREAD)
    with gateway(scratch_redis_url) as (client, celery):
        guest = post_slack(client, form(block_actions("fx_approve", approval_id,
                                                      user=SLACK_GUEST)))
        strangers = [post_slack(client, form(block_actions(
            "fx_approve", approval_id, user="U0NOBODY", trigger=f"5.6.{i}"))) for i in range(3)]
    assert {resp.status_code for resp in (guest, *strangers)} == {200}
    assert status(r, approval_id) == ("pending", None)
    assert celery.named(APPROVAL_RESUME_TASK) == []
    assert celery.named(SEND_TASK) == []
    conv = f"slack|C0123CHAN|{THREAD_TS}"
    assert celery.named(PRIVATE_SEND_TASK) == [[conv, SLACK_GUEST, GUEST_REFUSAL],
                                               [conv, "U0NOBODY", GUEST_REFUSAL]]


@pytest.mark.parametrize("payload", [
    {"type": "view_submission", "view": {"id": "V1"}},
    {"type": "message_action", "callback_id": "x", "trigger_id": "1.2"},
    block_actions("some_other_button", "0badcafe"),
    {**block_actions("fx_approve", "0badcafe"),
     "actions": [{"action_id": ["fx_approve"], "value": "0badcafe"}]},
])
def test_other_interactions_are_acknowledged_and_ignored(
    r: redis.Redis, scratch_redis_url: str, payload: dict[str, Any]
) -> None:
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_slack(client, form(payload))
    assert (resp.status_code, resp.content) == (200, b"")
    assert celery.sent == []


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "not an interaction: no payload field"),
    (urlencode({"command": "/stop"}).encode(), "not an interaction: no payload field"),
    (b"payload=%7Bnot+json", "body is not JSON"),
    (form([1, 2]), "body is not a JSON object"),
    (b"payload=%ff", "body is not UTF-8"),
    (form({"type": "block_actions", "actions": {"a": 1}}), "not a block action: actions"),
    (form({**block_actions("fx_approve", "0badcafe"), "user": {"id": "U 1|x"}}),
     "not a block action: user.id"),
    (form({**block_actions("fx_approve", "0badcafe"), "user": "U0OWNER"}),
     "not a block action: user.id"),
    (form(block_actions("fx_approve", {"id": "0badcafe"})), "not a block action: value"),
    (form({**block_actions("fx_approve", "0badcafe"), "container": {}, "channel": None}),
     "not a block action: channel"),
    (form({**block_actions("fx_approve", "0badcafe"), "trigger_id": None,
           "actions": [{"action_id": "fx_approve", "value": "0badcafe"}]}),
     "not a block action: trigger_id"),
    (form({**block_actions("fx_approve", "0badcafe"),
           "message": {"thread_ts": ["1.2"]}}), "not a block action: thread_ts"),
    (b"&".join(b"f%d=1" % i for i in range(5_000)), "body has more than 100 form fields"),
])
def test_a_signed_malformed_interaction_is_a_400_with_a_reason(
    r: redis.Redis, scratch_redis_url: str, body: bytes, reason: str
) -> None:
    with gateway(scratch_redis_url) as (client, celery):
        resp = post_slack(client, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith(reason)
    assert celery.sent == []


# --- fuzz: whatever a signed press holds, the answer is below 500 -----------------------------

def tg_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    return as_json(payload, True), telegram_headers()


def slack_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    body = urlencode({"payload": as_json(payload, True).decode()}).encode()
    return body, slack_headers(body, FORM)


PRESSES = {
    "/webhooks/telegram": (tg_press(80001, "fx:approve:0badcafe"), tg_body),
    "/webhooks/slack/interactions": (block_actions("fx_deny", "0badcafe"), slack_body),
}
_deliveries = itertools.count(80002)


def fresh(route: str) -> dict[str, Any]:
    """The route's valid press as a new delivery (so that each case reaches the answer)."""
    valid, n = PRESSES[route][0], next(_deliveries)
    if route == "/webhooks/telegram":
        return {**valid, "update_id": n}
    return {**valid, "trigger_id": f"{n}.1.a"}


def answer_below_500(client: TestClient, route: str, payload: Any) -> int:
    body, headers = PRESSES[route][1](payload)
    resp = client.post(route, content=body, headers=headers)
    assert resp.status_code < 500, (payload, resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        assert resp.json().get("error"), resp.text[:300]
    return resp.status_code


@pytest.fixture(scope="module")
def shared_app(scratch_redis_url: str) -> Iterator[TestClient]:
    with gateway(flushed(scratch_redis_url.rsplit("/", 1)[0] + "/4")) as (client, _):
        yield client


@pytest.mark.parametrize("route", PRESSES)
def test_every_field_of_a_press_replaced_by_anything_gets_an_answer_below_500(
    shared_app: TestClient, route: str
) -> None:
    statuses = [answer_below_500(shared_app, route, replaced(fresh(route), path, value))
                for path in field_paths(PRESSES[route][0]) for value in HOSTILE_VALUES]
    assert 200 in statuses and 400 in statuses


@pytest.mark.parametrize("route", PRESSES)
def test_any_value_anywhere_in_a_press_gets_an_answer_below_500(
    shared_app: TestClient, route: str
) -> None:
    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(path=st.sampled_from(list(field_paths(PRESSES[route][0]))), value=json_values)
    def one(path: tuple[str, ...], value: Any) -> None:
        answer_below_500(shared_app, route, replaced(fresh(route), path, value))

    one()
