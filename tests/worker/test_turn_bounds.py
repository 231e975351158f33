"""A turn's bounds on a real stack: /stop and the turn deadline cut a silent model call short,
and what a user sees of the reply (formatting, the silent token) end to end.

One worker process with a single slot (``-c 1``): when it is busy with a turn nothing else
runs, so a freed slot is visible as the next turn running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Hang, Reply
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_worker.turn.reply import EMPTY_COMPLETION, SILENT_HISTORY_MARKER
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, start, uniq, wait

TURN_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def single(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_TURN_TIMEOUT": str(TURN_TIMEOUT),
           "FERMIX_CANCEL_POLL_SECONDS": "0.5"}
    s = start_stack("bounds", redis_url, 7, env, logs_dir, workers=0)
    try:
        s.start_worker("bounds-w1", concurrency=1)
    except Exception:
        s.stop()
        raise
    yield s
    s.stop()


def history(stack: Stack, chat: str) -> list[ChatMessage]:
    raw = stack.redis().lrange(keys.history(f"http|{chat}|root"), 0, -1)
    return [ChatMessage.model_validate_json(x) for x in raw]  # type: ignore[union-attr]


def asked(llm: ScriptedLLMServer, text: str, timeout: float = 10) -> None:
    """Until the model has received the turn whose user message contains ``text``."""
    def has(req: dict) -> bool:
        return any(text in str(m.get("content")) for m in req["body"]["messages"])

    assert llm.script.wait_request(has, timeout), f"the model never got {text!r}"


def test_stop_abandons_a_silent_model_call_and_frees_the_slot_within_2s(
    single: Stack, llm: ScriptedLLMServer
) -> None:
    chat, text = uniq("chat"), uniq("silent-model")
    llm.script.push(Hang(seconds=60, match=text))
    with single.http() as http:
        run_id = start(http, text, chat)
        asked(llm, text)
        stopped_at = time.time()
        assert wait(http, start(http, "/stop", chat))["status"] == "ok"
        hung_up = llm.script.wait_hangup(text, 10)
        assert hung_up is not None, "the worker kept waiting on the model after /stop"
        released = hung_up - stopped_at
        print(f"\nmodel connection closed {released:.2f} s after /stop")
        assert released < 2.0
        assert wait(http, run_id)["status"] == "stopped"
        # The only slot is free again: another conversation's turn runs at once.
        other = uniq("after-stop")
        llm.script.push(Reply(text="free again", match=other))
        began = time.time()
        done = wait(http, start(http, other, uniq("chat")), timeout=10)
        assert done["reply"] == "free again"
        print(f"next turn answered {time.time() - began:.2f} s later")


def test_a_turn_past_its_deadline_is_stopped_and_the_next_message_runs(
    single: Stack, llm: ScriptedLLMServer
) -> None:
    chat, slow, nxt = uniq("chat"), uniq("slow"), uniq("next")
    llm.script.push(Reply(text="far too late", delay=60, match=slow),
                    Reply(text="next one", match=nxt))
    with single.http() as http:
        slow_id = start(http, slow, chat)
        next_id = start(http, nxt, chat)
        ended = wait(http, slow_id, timeout=20)
        assert ended["status"] == "error"
        assert ended["error"].startswith("That took too long: I stopped working on it after 3 s.")
        took = (ended["endedAt"] - ended["startedAt"]) / 1000
        assert TURN_TIMEOUT <= took < TURN_TIMEOUT + 2.0, took
        assert llm.script.wait_hangup(slow, 5) is not None, "the model call was not abandoned"
        assert wait(http, next_id, timeout=20)["reply"] == "next one"


def test_the_reply_keeps_its_formatting_and_equals_the_stream(
    single: Stack, llm: ScriptedLLMServer
) -> None:
    code = "```python\ndef f(x):\n    if x:\n        return  x  *  2\n```\n\n| a  | b |"
    text = uniq("code")
    llm.script.push(Reply(text=code, match=text))
    chat = uniq("chat")
    with single.http() as http:
        run_id = start(http, text, chat)
        assert wait(http, run_id)["reply"] == code
        streamed = "".join(d.get("delta", "") for s, d in events(http, run_id) if s == "assistant")
    assert streamed == code
    assert history(single, chat)[-1].content == code


def test_a_reply_of_only_no_reply_is_silent_on_an_interactive_turn(
    single: Stack, llm: ScriptedLLMServer
) -> None:
    quiet, keep, empty = uniq("quiet"), uniq("keep"), uniq("empty")
    llm.script.push(Reply(text="NO_REPLY", match=quiet),
                    Reply(text="Set NO_REPLY_TO=foo in the config.", match=keep),
                    Reply(text="", match=empty))
    chat = uniq("chat")
    with single.http() as http:
        run_id = start(http, quiet, chat)
        done = wait(http, run_id)
        assert done["status"] == "ok" and done["reply"] == ""
        assert not [d for s, d in events(http, run_id) if s == "assistant" and d.get("delta")]
        kept = wait(http, start(http, keep, chat))
        assert kept["reply"] == "Set NO_REPLY_TO=foo in the config."
        assert wait(http, start(http, empty, uniq("chat")))["reply"] == EMPTY_COMPLETION
    said = [m.content for m in history(single, chat) if m.role == "assistant"]
    assert said == [SILENT_HISTORY_MARKER, "Set NO_REPLY_TO=foo in the config."]
