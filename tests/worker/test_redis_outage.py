"""Redis goes away under a running stack: turns in flight pause and finish instead of failing,
and the gateway answers 503 fast while Redis is gone (or frozen) and 200 at once when it is back.

This stack has its own redis-server (AOF on), restarted on the same port and data directory.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fermix_dev.procs import Managed
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from tests.conftest import OwnRedis, Stack, provider_env, start_stack
from tests.fleet import start, uniq, wait


@pytest.fixture(scope="module")
def stack(own_redis: OwnRedis, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("outage", own_redis.url, 0, provider_env(llm, "openai"), logs_dir, workers=1)
    yield s
    s.stop()


def history(stack: Stack, chat: str) -> list[ChatMessage]:
    raw = stack.redis().lrange(keys.history(f"http|{chat}|root"), 0, -1)
    return [ChatMessage.model_validate_json(x) for x in raw]  # type: ignore[union-attr]


def timed_get(http: httpx.Client, path: str) -> tuple[int, float]:
    began = time.monotonic()
    try:
        status = http.get(path, timeout=30).status_code
    except httpx.HTTPError:
        status = 0
    return status, time.monotonic() - began


def test_a_redis_restart_pauses_a_turn_in_flight_instead_of_failing_it(
    own_redis: OwnRedis, stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat, text = uniq("chat"), uniq("during-outage")
    answer = f"answer to {text}: " + " ".join(f"word{i}" for i in range(12))
    # The answer streams for ~6 s: run events are written while Redis is away.
    llm.script.push(Reply(text=answer, delay=0.2, chunk_delay=0.5, match=text))
    with stack.http() as http:
        run_id = start(http, text, chat)
        assert llm.script.wait_request(lambda q: text in str(q["body"]), 15)
        back = own_redis.restart_after(8.0)  # down while the model streams and the turn delivers
        status, took = timed_get(http, f"/v1/runs/{run_id}")
        assert status == 503 and took < 3.0, (status, took)
        back.join()
        done = wait(http, run_id, timeout=40)
    assert done["status"] == "ok" and done["reply"] == answer
    said = [m.content for m in history(stack, chat)]
    assert said == [text, answer]


def test_the_gateway_answers_503_fast_while_redis_is_frozen_and_recovers_at_once(
    own_redis: OwnRedis, stack: Stack
) -> None:
    with stack.http() as http:
        assert http.get("/v1/status").status_code == 200
        frozen: Managed = own_redis.proc
        frozen.kill(signal.SIGSTOP)
        try:
            status, took = timed_get(http, "/v1/status")
        finally:
            frozen.kill(signal.SIGCONT)
        assert status == 503 and took < 3.0, (status, took)
        # Back: no stale pooled connection turns the next requests into errors.
        answers = [http.get("/v1/status").status_code for _ in range(5)]
        assert answers == [200] * 5
