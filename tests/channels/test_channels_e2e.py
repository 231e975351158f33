"""Telegram and Slack end to end: webhooks into a real gateway (uvicorn), turns on two real
workers, replies out to fake Bot API and Web API servers over real HTTP. Calculator calls need
approval here: the question goes out with buttons, and pressing one resumes the turn."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.slack_api import FakeSlack, sign
from tests.fakes.telegram_api import FakeTelegram, keyboard_of, visible_text
from tests.fleet import uniq

TG_SECRET = "tg-webhook-secret"
SLACK_SECRET = "slack-signing-secret"
OWNER, GUEST, STRANGER = 111, 222, 999
_update_ids = itertools.count(1000)


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram() as fake:
        yield fake


@pytest.fixture(scope="module")
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram,
          slack: FakeSlack) -> Iterator[Stack]:
    env = {
        **provider_env(llm, "openai"),
        "FERMIX_TELEGRAM_BOT_TOKEN": tg.token,
        "FERMIX_TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
        "FERMIX_TELEGRAM_API_BASE": tg.url,
        "FERMIX_TELEGRAM_BOT_USERNAME": tg.bot_username,
        "FERMIX_SLACK_BOT_TOKEN": "xoxb-test",
        "FERMIX_SLACK_SIGNING_SECRET": SLACK_SECRET,
        "FERMIX_SLACK_API_BASE": slack.url,
        "FERMIX_SLACK_BOT_USER_ID": "UFERMIXBOT",
        "FERMIX_OWNER_IDS": f"telegram:{OWNER},slack:U111",
        "FERMIX_ALLOWED_IDS": f"telegram:{GUEST},slack:U222",
        "FERMIX_APPROVALS__TOOLS": '["calculator"]',
    }
    s = start_stack("channels", redis_url, 15, env, logs_dir, workers=2)
    yield s
    s.stop()


# --- Telegram -----------------------------------------------------------------------------


def tg_update(chat: int, user: int, text: str, *, update_id: int | None = None,
              chat_type: str = "private", topic: int | None = None) -> dict[str, Any]:
    """An Update shaped like the Bot API documentation's examples."""
    message: dict[str, Any] = {
        "message_id": next(_update_ids), "date": int(time.time()), "text": text,
        "from": {"id": user, "is_bot": False, "first_name": "Ada"},
        "chat": {"id": chat, "type": chat_type, **({"title": "Team"} if chat < 0 else {"first_name": "Ada"})},
    }
    if topic is not None:
        message.update(message_thread_id=topic, is_topic_message=True)
        message["chat"]["is_forum"] = True
    return {"update_id": update_id if update_id is not None else next(_update_ids), "message": message}


def post_tg(stack: Stack, update: dict[str, Any], secret: str | None = TG_SECRET) -> httpx.Response:
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret else {}
    return httpx.post(f"{stack.url}/webhooks/telegram", json=update, headers=headers, timeout=10)


def idle(stack: Stack, conv: str) -> bool:
    r = stack.redis()
    return not r.exists(keys.active(conv)) and not r.llen(keys.inbox(conv))


def tg_replies(tg: FakeTelegram, chat: int) -> list[dict[str, Any]]:
    return [m for m in tg.sent() if m["chat_id"] == chat]


def wait_for_replies(tg: FakeTelegram, stack: Stack, chat: int, n: int, conv: str | None = None) -> list[dict[str, Any]]:
    """Until ``n`` replies reached the chat and its conversation is idle (readiness probes)."""
    wait_until(lambda: len(tg_replies(tg, chat)) >= n, 30, f"{n} replies in {chat}")
    wait_until(lambda: idle(stack, conv or f"telegram|{chat}|root"), 30, "conversation idle")
    return tg_replies(tg, chat)


def test_forged_or_missing_secret_is_refused_and_nothing_runs(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    text = uniq("forged")
    for secret in ("wrong-secret", None):
        resp = post_tg(stack, tg_update(5001, OWNER, text), secret=secret)
        assert resp.status_code == 401
    assert not stack.redis().exists(keys.inbox("telegram|5001|root"))
    assert tg_replies(tg, 5001) == []
    assert not [q for q in llm.script.requests if text in json.dumps(q["body"])]


def test_the_same_update_delivered_twice_gets_one_reply(stack: Stack, tg: FakeTelegram) -> None:
    text = uniq("twice")
    update = tg_update(5002, OWNER, text)
    assert post_tg(stack, update).status_code == 200
    assert post_tg(stack, update).status_code == 200  # Telegram's retry of the same update_id
    (reply,) = wait_for_replies(tg, stack, 5002, 1)
    assert reply["text"] == f'Scripted reply: you said "{text}"'


@pytest.mark.parametrize("chunk_delay", [0.0, 0.002], ids=["fast", "streamed"])
def test_a_long_answer_arrives_in_order_in_chunks_in_its_topic(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer, chunk_delay: float
) -> None:
    """``streamed``: the model writes for about 4 s, so the live message starts (after 1 s)
    and the final reply's first chunk replaces its text. Either way the chat shows every
    paragraph once, in order; the chat is read as it is now, edits applied."""
    text = uniq("essay")
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(30)]
    llm.script.push(Reply(text="\n\n".join(paragraphs), match=text, chunk_delay=chunk_delay))
    chat, topic = (-1007002 if chunk_delay else -1007001), 77
    assert post_tg(stack, tg_update(chat, OWNER, f"@{tg.bot_username} {text}",
                                    chat_type="supergroup", topic=topic)).status_code == 200
    wait_until(lambda: "Paragraph 29" in "".join(m.text for m in tg.chat(chat)), 60,
               "the whole answer")
    wait_until(lambda: idle(stack, f"telegram|{chat}|{topic}"), 30, "conversation idle")
    messages = tg.chat(chat)
    assert len(messages) >= 2
    assert all(m["message_thread_id"] == topic for m in tg_replies(tg, chat)), \
        "replies stay in the topic"
    assert all(len(m.text) <= 4096 for m in messages)
    shown = "\n\n".join(m.text for m in messages)
    assert [p.strip() for p in shown.split("\n\n")] == [p.strip() for p in paragraphs]
    assert all(m.edits == 0 for m in messages[1:]), "only the live message is edited"
    if chunk_delay:
        assert messages[0].edits >= 1, "the reply was shown while it was written"


def test_typing_is_shown_every_4_s_during_a_slow_turn_and_stops_when_it_ends(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    text, chat = uniq("slow"), 5003
    llm.script.push(Reply(text="finally", delay=9, match=text))
    assert post_tg(stack, tg_update(chat, OWNER, text)).status_code == 200
    (reply,) = wait_for_replies(tg, stack, chat, 1)
    replied_at = next(c.at for c in tg.calls("sendMessage") if c.body["chat_id"] == chat)
    typing = [c.at for c in tg.calls("sendChatAction") if c.body["chat_id"] == chat]
    assert len(typing) == 3, typing  # at 0, 4 and 8 s of a 9 s turn
    assert all(3.5 <= b - a <= 4.5 for a, b in zip(typing, typing[1:], strict=False))
    assert max(typing) < replied_at, "no typing after the reply"
    assert reply["text"] == "finally"


def test_a_429_from_telegram_delays_the_reply_which_still_arrives_once(
    stack: Stack, tg: FakeTelegram
) -> None:
    chat = 5004
    tg.fail_next("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
    assert post_tg(stack, tg_update(chat, OWNER, uniq("limited"))).status_code == 200
    replies = wait_for_replies(tg, stack, chat, 1)
    assert len(replies) == 1
    attempts = [c for c in tg.calls("sendMessage") if c.body["chat_id"] == chat]
    assert [c.status for c in attempts] == [429, 200]
    assert attempts[1].at - attempts[0].at >= 0.95


def test_an_unknown_user_never_reaches_the_model(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, secret_text, known = 5005, uniq("stranger"), uniq("known")
    assert post_tg(stack, tg_update(chat, STRANGER, secret_text)).status_code == 200
    # FIFO: had the stranger's message been queued, it would be answered before this one.
    assert post_tg(stack, tg_update(chat, OWNER, known)).status_code == 200
    (reply,) = wait_for_replies(tg, stack, chat, 1)
    assert known in reply["text"]
    assert not [q for q in llm.script.requests if secret_text in json.dumps(q["body"])]


def test_owner_only_commands_are_refused_for_guests(stack: Stack, tg: FakeTelegram) -> None:
    chat = 5006
    assert post_tg(stack, tg_update(chat, GUEST, "/ultra find everything")).status_code == 200
    assert post_tg(stack, tg_update(chat, GUEST, f"/whoami@{tg.bot_username}")).status_code == 200
    replies = wait_for_replies(tg, stack, chat, 2)
    assert [m["text"] for m in replies] == [
        "Sorry, /ultra is only available to the owner.",
        f"You are telegram:{GUEST} (guest).",
    ]


def script_calculation(llm: ScriptedLLMServer, task: str) -> None:
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=task),
        Reply(text=f"42, as approved: {task}", match=task),
    )


def test_pressing_approve_under_the_question_resumes_the_turn(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, task = 5007, uniq("calc")
    script_calculation(llm, task)
    assert post_tg(stack, tg_update(chat, OWNER, task)).status_code == 200
    wait_until(lambda: any(keyboard_of(m) for m in tg_replies(tg, chat)), 30, "the question")
    (question,) = tg_replies(tg, chat)
    [[approve, deny]] = keyboard_of(question) or []
    assert (approve["text"], deny["text"]) == ("Approve", "Deny")
    approval_id = approve["callback_data"].removeprefix("fx:approve:")
    assert deny["callback_data"] == f"fx:deny:{approval_id}"
    assert "/approve " + approval_id in visible_text(question["text"], "HTML")

    press = {"update_id": next(_update_ids), "callback_query": {
        "id": "77001", "chat_instance": "-1", "data": approve["callback_data"],
        "from": {"id": OWNER, "is_bot": False, "first_name": "Ada"},
        "message": {"message_id": 1, "date": int(time.time()), "text": "Approval needed",
                    "chat": {"id": chat, "type": "private"}}}}
    resp = post_tg(stack, press)
    assert resp.json() == {"method": "answerCallbackQuery", "callback_query_id": "77001",
                           "text": f"Approved {approval_id}: calculator will run now."}
    wait_until(lambda: len(tg_replies(tg, chat)) >= 3, 30, "the announcement and the answer")
    wait_until(lambda: idle(stack, f"telegram|{chat}|root"), 30, "conversation idle")
    shown = {visible_text(m["text"], m.get("parse_mode")) for m in tg_replies(tg, chat)[1:]}
    assert shown == {f"Approved {approval_id}: calculator will run now.",
                     f"42, as approved: {task}"}


# --- Slack --------------------------------------------------------------------------------


def slack_event(event: dict[str, Any], event_id: str) -> dict[str, Any]:
    return {"token": "x", "team_id": "T1", "api_app_id": "A1", "type": "event_callback",
            "event_id": event_id, "event_time": int(time.time()), "event": event,
            "authorizations": [{"user_id": "UFERMIXBOT", "is_bot": True}]}


def post_slack(stack: Stack, payload: dict[str, Any], *, secret: str = SLACK_SECRET,
               timestamp: int | None = None, retry: int | None = None) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json", **sign(body, secret, timestamp)}
    if retry is not None:
        headers.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"})
    return httpx.post(f"{stack.url}/webhooks/slack/events", content=body, headers=headers, timeout=10)


def slack_posts(slack: FakeSlack, channel: str) -> list[dict[str, Any]]:
    return [c.args for c in slack.calls("chat.postMessage", ok=True) if c.args.get("channel") == channel]


def test_forged_or_stale_slack_signatures_are_refused(stack: Stack, slack: FakeSlack) -> None:
    event = slack_event({"type": "app_mention", "user": "U111", "text": "<@UFERMIXBOT> hi",
                         "channel": "C900", "ts": "1700000000.000100"}, uniq("Ev"))
    assert post_slack(stack, event, secret="forged").status_code == 401
    assert post_slack(stack, event, timestamp=int(time.time()) - 6 * 60).status_code == 401
    assert not stack.redis().exists(keys.inbox("slack|C900|1700000000.000100"))
    assert slack_posts(slack, "C900") == []


def test_a_mention_is_answered_once_in_a_thread_even_when_slack_retries(
    stack: Stack, slack: FakeSlack
) -> None:
    ts, event_id, text = "1700000001.000200", uniq("Ev"), uniq("hello")
    event = slack_event({"type": "app_mention", "user": "U111", "text": f"<@UFERMIXBOT> {text}",
                         "channel": "C901", "ts": ts}, event_id)
    started = time.monotonic()
    assert post_slack(stack, event).status_code == 200
    assert time.monotonic() - started < 3, "Slack wants an answer within 3 s"
    assert post_slack(stack, event, retry=1).status_code == 200
    wait_until(lambda: len(slack_posts(slack, "C901")) >= 1, 30, "slack reply")
    wait_until(lambda: idle(stack, f"slack|C901|{ts}"), 30, "conversation idle")
    (post,) = slack_posts(slack, "C901")
    assert post["thread_ts"] == ts and text in post["text"]
    statuses = [c.args for c in slack.calls("assistant.threads.setStatus")
                if c.args.get("channel_id") == "C901"]
    assert [s["status"] for s in statuses] == ["is working…", ""], "status shown, then cleared"


def test_a_slash_command_answers_ephemerally_without_posting(stack: Stack, slack: FakeSlack) -> None:
    form = {"command": "/whoami", "text": "", "user_id": "U222", "channel_id": "C902",
            "trigger_id": uniq("trig"), "team_id": "T1"}
    body = httpx.QueryParams(form).__str__().encode()
    resp = httpx.post(f"{stack.url}/webhooks/slack/commands", content=body, timeout=10,
                      headers={"content-type": "application/x-www-form-urlencoded",
                               **sign(body, SLACK_SECRET)})
    assert resp.status_code == 200
    assert resp.json() == {"response_type": "ephemeral", "text": "You are slack:U222 (guest)."}
    assert slack_posts(slack, "C902") == []


def test_pressing_approve_in_slack_resumes_the_turn_in_its_thread(
    stack: Stack, slack: FakeSlack, llm: ScriptedLLMServer
) -> None:
    ts, task = "1700000003.000400", uniq("calc")
    script_calculation(llm, task)
    event = slack_event({"type": "app_mention", "user": "U111", "text": f"<@UFERMIXBOT> {task}",
                         "channel": "C903", "ts": ts}, uniq("Ev"))
    assert post_slack(stack, event).status_code == 200
    wait_until(lambda: any("blocks" in p for p in slack_posts(slack, "C903")), 30, "question")
    (question,) = slack_posts(slack, "C903")
    assert question["thread_ts"] == ts
    approve, deny = question["blocks"][1]["elements"]
    assert (approve["action_id"], deny["action_id"]) == ("fx_approve", "fx_deny")
    approval_id = approve["value"]

    payload = {"type": "block_actions", "user": {"id": "U111"}, "trigger_id": uniq("trig"),
               "container": {"type": "message", "channel_id": "C903", "thread_ts": ts,
                             "message_ts": "1700000003.000500"},
               "message": {"ts": "1700000003.000500", "thread_ts": ts},
               "actions": [{**approve, "action_ts": "1700000004.000000"}]}
    body = httpx.QueryParams({"payload": json.dumps(payload)}).__str__().encode()
    started = time.monotonic()
    resp = httpx.post(f"{stack.url}/webhooks/slack/interactions", content=body, timeout=10,
                      headers={"content-type": "application/x-www-form-urlencoded",
                               **sign(body, SLACK_SECRET)})
    assert (resp.status_code, resp.content) == (200, b"")
    assert time.monotonic() - started < 3, "Slack wants an answer within 3 s"
    wait_until(lambda: len(slack_posts(slack, "C903")) >= 3, 30, "announcement and answer")
    wait_until(lambda: idle(stack, f"slack|C903|{ts}"), 30, "conversation idle")
    later = slack_posts(slack, "C903")[1:]
    assert all(p["thread_ts"] == ts for p in later)
    assert {p["text"] for p in later} == {f"Approved {approval_id}: `calculator` will run now.",
                                          f"42, as approved: {task}"}


def test_a_guests_press_is_refused_to_them_alone_not_in_the_channel(
    stack: Stack, slack: FakeSlack
) -> None:
    """Issue 25 item 13: a guest's press of an approval button made the bot post the refusal
    into the thread for everyone. Now a worker shows it to the presser alone
    (``chat.postEphemeral``); the channel gets nothing."""
    ts = "1700000009.000100"
    payload = {"type": "block_actions", "user": {"id": "U222"}, "trigger_id": uniq("trig"),
               "container": {"type": "message", "channel_id": "C909", "thread_ts": ts,
                             "message_ts": "1700000009.000200"},
               "message": {"ts": "1700000009.000200", "thread_ts": ts},
               "actions": [{"action_id": "fx_approve", "value": "0badcafe",
                            "action_ts": "1700000009.000300"}]}
    body = httpx.QueryParams({"payload": json.dumps(payload)}).__str__().encode()
    resp = httpx.post(f"{stack.url}/webhooks/slack/interactions", content=body, timeout=10,
                      headers={"content-type": "application/x-www-form-urlencoded",
                               **sign(body, SLACK_SECRET)})
    assert (resp.status_code, resp.content) == (200, b"")

    def ephemeral() -> list[dict[str, Any]]:
        return [c.args for c in slack.calls("chat.postEphemeral", ok=True)
                if c.args.get("channel") == "C909"]

    wait_until(lambda: ephemeral(), 30, "the private refusal")
    (refusal,) = ephemeral()
    assert (refusal["user"], refusal["thread_ts"], refusal["text"]) == (
        "U222", ts, "Sorry, only the owner can answer approvals.")
    assert slack_posts(slack, "C909") == []
