"""A worker that dies as it sends a reply does not cost the user the reply (issue 25 item 5).

Telegram webhooks into a real gateway, two real workers, the fake Bot API on 127.0.0.1. The
first ``sendMessage`` of the reply is held at the fake until its worker is SIGKILLed, then
dropped: the worker died after it marked the reply as being delivered and before Telegram got
it. No failover: the Redis primary is the one the mark was written on, so the chunk marks are
authoritative and the turn recovered on the other worker sends the reply, once.

Under Sentinel (``FERMIX_REDIS_WAIT_REPLICAS`` unset: ``auto``, the replica connected) and on
plain Redis (no WAIT), as before the durability wait.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.stores import history
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import telegram_say, uniq
from tests.sentinels import SentinelSet

SECRET = "crash-webhook-secret"
OWNER = 4712
_ids = itertools.count(70_000)


def _env(llm: ScriptedLLMServer, tg: FakeTelegram) -> dict[str, str]:
    return {
        **provider_env(llm, "openai"),
        **tg.gateway_env(SECRET, OWNER),
        "FERMIX_TELEGRAM_STREAMING": "off",  # the reply goes out in one send, at delivery
        "FERMIX_LEASE_SECONDS": "3",
        "FERMIX_CANCEL_POLL_SECONDS": "0.2",
    }


@pytest.fixture(params=["sentinel", "plain"])
def stack(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
          llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram) -> Iterator[Stack]:
    env = _env(llm, tg)
    sset: SentinelSet | None = None
    if request.param == "sentinel":
        sset = SentinelSet(tmp_path, logs_dir, replicas=1)
        base = f"redis://127.0.0.1:{sset.primary_port}/0"
        env.update(sset.env(db=0))
    else:
        base = redis_url
    try:
        s = start_stack(f"crash-{request.param}", base, 0 if sset else 13, env, logs_dir,
                        workers=2)
        try:
            yield s
        finally:
            s.stop()
    finally:
        if sset is not None:
            sset.stop()


def test_a_worker_killed_as_it_sends_the_reply_leaves_the_user_one_reply(
    stack: Stack, tg: FakeTelegram, llm: ScriptedLLMServer
) -> None:
    chat, text = next(_ids), uniq("crash")
    conv = f"telegram|{chat}|root"
    reply = f"the one reply to {text}"
    llm.script.push(Reply(text=reply, match=text))
    r = stack.redis()
    held = tg.hold_next("sendMessage")
    try:
        telegram_say(stack.url, SECRET, OWNER, chat, text, _ids)
        assert held.arrived.wait(30), "the reply was never sent"
        run_id = r.hget(keys.active(conv), "turn_id")
        assert isinstance(run_id, str)
        # Killed after the mark, before Telegram has the reply.
        assert r.hget(keys.active(conv), "delivering") is not None
        with stack.http() as http:
            victim = stack.kill_holder(http, run_id)
            held.release()
            wait_until(lambda: not r.exists(keys.active(conv)), 30, "the recovered turn to end")
            run = http.get(f"/v1/runs/{run_id}").json()
    finally:
        held.release()
    assert (run["status"], run["reply"]) == ("ok", reply)
    assert run["worker"].split("@")[0] != victim.name
    assert [m.text for m in tg.chat(chat)] == [reply], "the reply reaches the chat, once"
    said = [m.content for m in history.load(r, conv, 100)
            if isinstance(m, ChatMessage) and m.role == "assistant"]
    assert said == [reply], "answered once in history"
