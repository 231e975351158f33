"""``fermix agent`` shows the run's tool calls on stderr while its reply streams on stdout (a
dim line as each starts, a green or red one as it ends, on a terminal; plain lines piped), and
``--json`` prints the run and its calls as one document. Through the real gateway app (the
run's events written as a worker writes them), and ``--local`` with the scripted model."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.models import ConversationKey, InboundMessage, RunStatus, now
from fermix_shared.run_events import AssistantDelta, RunStarted, ToolFinished, ToolStarted
from fermix_shared.stores import runs
from fermix_shared.stores.events import RunEvents
from tests.cli.conftest import TOKEN
from tests.cli.terminal import Ran, clean_env, fermix, plain, start
from tests.conftest import provider_env
from tests.gateway.inprocess import RecordingCelery
from tests.gateway.test_run_wait import end

# Every test here runs `fermix` (tests/cli/terminal.py starts it on a terminal or a pipe).
pytestmark = pytest.mark.fleet

REPLY = "Let me work it out. It is 42."


def _took(text: str) -> list[str]:
    return [re.sub(r"\d+\.\d\d s$", "T s", line) for line in text.splitlines()]


def _worker_turn(r: redis.Redis, chat: str) -> None:
    """What a worker writes for the CLI's message: two deltas around two tool calls."""
    inbox = keys.inbox(ConversationKey(channel="http", chat_id=chat).as_str())
    wait_until(lambda: r.llen(inbox) == 1, 15, "the message in its inbox")
    rec = runs.get(r, InboundMessage.model_validate_json(str(r.lindex(inbox, 0))).run_id)
    assert rec is not None  # queued, as the gateway accepted it
    events = RunEvents(r, rec.run_id)
    events.emit(RunStarted(started_at=now(), resumed=False))
    events.emit(AssistantDelta(delta="Let me work it out."))
    events.emit(ToolStarted(name="calculator", call_id="c1", args={"expression": "6*7"}))
    events.emit(ToolFinished(name="calculator", call_id="c1", is_error=False, result="42"))
    events.emit(ToolStarted(name="web_fetch", call_id="c2"))
    events.emit(ToolFinished(name="web_fetch", call_id="c2", is_error=True))
    events.emit(AssistantDelta(delta=" It is 42."))
    end(r, rec, RunStatus.ok, reply=REPLY)


@pytest.fixture
def agent(served: tuple[str, RecordingCelery], r: redis.Redis
          ) -> Callable[..., Ran]:
    def run(*args: str, tty: Literal["stdout", "stderr", None] = None) -> Ran:
        chat = f"tools-{uuid.uuid4().hex[:8]}"
        env = clean_env(dict(os.environ), FERMIX_GATEWAY_URL=served[0], FERMIX_API_TOKEN=TOKEN)
        running = start(env, "agent", "-m", "what is 6*7?", "--chat", chat, "--timeout", "30",
                        *args, tty=tty)
        _worker_turn(r, chat)
        return running.wait()

    return run


def test_tool_calls_are_lines_on_stderr_and_the_reply_is_untouched(agent: Callable[..., Ran]
                                                                   ) -> None:
    piped = agent()
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == REPLY + "\n"
    assert _took(piped.stderr) == ["tool calculator(expression='6*7')", "tool calculator ok T s",
                                   "tool web_fetch", "tool web_fetch failed T s"]
    seen = agent(tty="stderr")
    assert seen.stdout == REPLY + "\n"
    assert _took(plain(seen.stderr)) == ["→ calculator(expression='6*7')",
                                         "  ✓ calculator ok, T s", "→ web_fetch",
                                         "  ✗ web_fetch failed, T s"]
    assert "\x1b[31m  ✗ web_fetch" in seen.stderr  # a failed call in red


def test_json_is_the_run_and_its_tool_calls(agent: Callable[..., Ran]) -> None:
    out = agent("--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert (body["status"], body["reply"]) == ("ok", REPLY)
    assert [(t["name"], t["args"], t["isError"], t["result"]) for t in body["tools"]] == [
        ("calculator", {"expression": "6*7"}, False, "42"), ("web_fetch", None, True, None)]


def test_a_local_turn_shows_its_tool_calls(r: redis.Redis, scratch_redis_url: str,
                                           llm: ScriptedLLMServer, tmp_path: Path) -> None:
    text = f"multiply-{uuid.uuid4().hex[:8]}"
    llm.script.push(Reply(match=text, tool_calls=[ToolCallSpec("calculator",
                                                               {"expression": "6*7"})]),
                    Reply(text="42.", match=text))
    env = clean_env(dict(os.environ), FERMIX_REDIS_URL=scratch_redis_url,
                    FERMIX_HOME=str(tmp_path), FERMIX_RUNS__VERBOSE="true",
                    **provider_env(llm, "openai"))
    out = fermix(env, "agent", "--local", "-m", text, "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert (body["status"], body["reply"]) == ("ok", "42.")
    assert [(t["name"], t["args"], t["isError"]) for t in body["tools"]] == [
        ("calculator", {"expression": "6*7"}, False)]
    assert [line for line in _took(out.stderr) if line.startswith("tool ")] == [
        "tool calculator(expression='6*7')", "tool calculator ok T s"]
