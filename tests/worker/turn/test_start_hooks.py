"""The hook points of a turn's start that the Fased seed lists beside the explicit ones:
``session_start`` on a conversation's first message (and ``session_end`` at ``/new`` or
``/reset``), ``agent:bootstrap`` over the prompt's bootstrap files, ``before_agent_start``.

A turn runs in this process (TurnRunner) on a real Redis, its model calls through the
official SDK to the scripted LLM server; the session test accepts its messages and commands
through the real gateway app (in-process) on the same Redis.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.providers import build_router
from fermix_worker.tools import ToolRegistry
from fermix_worker.turn import TurnRunner
from tests.conftest import provider_env
from tests.fleet import turn_calls, uniq
from tests.seed_text import quoted


def seed_hook(phrase: str) -> str:
    """The hook name the seed writes in backticks at the start of ``phrase``."""
    match = re.match(r"\*\*`([^`]+)`\*\*", quoted("S", phrase))
    assert match, phrase
    return match.group(1)


@pytest.fixture
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


def worker_settings(url: str, home: Path) -> Settings:
    return Settings(redis_url=url, provider="openai", model="scripted-openai", home=home)


def run_next(r: redis.Redis, runner: TurnRunner, conv: str) -> None:
    """What a worker's dispatch does: claim the conversation's next message, run its turn."""
    claim, lease = queue.claim(r, conv, "w:1", 30)
    assert lease is not None and claim.messages
    runner.run(claim.messages, lease)


def sent_for(llm: ScriptedLLMServer, text: str) -> dict[str, Any]:
    (req,) = [q for q in turn_calls(llm.script.requests) if text in json.dumps(q["body"])]
    return req


class Sessions:
    def __init__(self) -> None:
        self.heard: list[tuple[str, dict[str, Any]]] = []

    def session_start(self, payload: dict[str, Any]) -> None:
        self.heard.append(("start", payload))

    def session_end(self, payload: dict[str, Any]) -> None:
        self.heard.append(("end", payload))


@pytest.mark.usefixtures("sdk_env")
def test_a_session_starts_with_the_first_message_and_ends_at_new_or_reset(
    r: redis.Redis, scratch_redis_url: str, tmp_path: Path
) -> None:
    said = quoted("S", "**`session_start` / `session_end`**: session lifecycle boundaries.")
    plugin, hooks = Sessions(), HookRegistry()
    hooks.register("sessions", plugin)
    assert all(hooks.has(h) for h in re.findall(r"`(\w+)`", said))  # type: ignore[arg-type]
    settings = worker_settings(scratch_redis_url, tmp_path)
    runner = TurnRunner(r, settings, ToolRegistry([]), router=lambda: build_router(settings),
                        hooks=hooks)
    chat = uniq("chat")
    conv = ConversationKey(channel="http", chat_id=chat).as_str()
    with TestClient(create_app(Settings(redis_url=scratch_redis_url), hooks=hooks)) as gw:
        def say(text: str) -> str:
            resp = gw.post("/v1/agent", json={"message": text, "chatId": chat}).json()
            if not text.startswith("/"):
                run_next(r, runner, conv)
            return str(resp["runId"])

        first = say("hello")
        say("and again")  # the same session: no second start
        say("/reset")
        after = say("a fresh start")
        say("/new")
        say("/new")  # nothing to end: the conversation has had no message since
    assert [kind for kind, _ in plugin.heard] == ["start", "end", "start", "end"]
    (start1, p1), (_, end1), (_, p2), (_, end2) = plugin.heard
    assert p1["conversation"] == conv and p1["run_id"] == first and p1["agent"] == "default"
    assert end1 == {"conversation": conv, "session_id": p1["session_id"], "by": "http:api",
                    "reason": "reset"}
    assert p2["run_id"] == after and p2["session_id"] != p1["session_id"]
    assert end2["session_id"] == p2["session_id"] and end2["reason"] == "new"


class Bootstrap:
    def __init__(self, extra: str):
        self.extra = extra
        self.given: list[str] = []

    def agent_bootstrap(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.given = [f["name"] for f in payload["files"]]
        kept = [f for f in payload["files"] if f["name"] != "drop.md"]
        return {"files": [*kept, {"name": "extra.md", "content": self.extra}, {"name": 3}]}


@pytest.mark.usefixtures("sdk_env")
def test_agent_bootstrap_adds_and_removes_the_prompts_bootstrap_files(
    r: redis.Redis, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    hook = seed_hook("**`agent:bootstrap`**: runs while building bootstrap files before the "
                     "system prompt is finalized. Use this to add/remove bootstrap context files.")
    keep, drop, extra = uniq("KEEP"), uniq("DROP"), uniq("EXTRA")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "keep.md").write_text(keep)
    (tmp_path / "memory" / "drop.md").write_text(drop)
    plugin, hooks = Bootstrap(extra), HookRegistry()
    hooks.register("bootstrap", plugin)
    assert hooks.has(hook)  # type: ignore[arg-type]
    settings = worker_settings("redis://unused", tmp_path)
    runner = TurnRunner(r, settings, ToolRegistry([]), router=lambda: build_router(settings),
                        hooks=hooks)
    text = uniq("boot")
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=uniq("c")), text=text)
    queue.accept(r, msg)
    run_next(r, runner, msg.key.as_str())
    assert plugin.given == ["drop.md", "keep.md"]
    system = sent_for(llm, text)["body"]["messages"][0]["content"]
    assert keep in system and f"### extra.md\n{extra}" in system and drop not in system


class Legacy:
    def before_agent_start(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"provider": "anthropic", "model": "claude-legacy",
                "prependContext": f"[context for {payload['text']}]"}

    def before_model_resolve(self, payload: dict[str, Any]) -> None:
        assert (payload["provider"], payload["model"]) == ("anthropic", "claude-legacy")


@pytest.mark.usefixtures("sdk_env")
def test_before_agent_start_may_act_in_either_phase(
    r: redis.Redis, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    hook = seed_hook("**`before_agent_start`**: legacy compatibility hook that may run in either "
                     "phase; prefer the explicit hooks above.")
    hooks = HookRegistry()
    hooks.register("legacy", Legacy())
    assert hooks.has(hook)  # type: ignore[arg-type]
    text = uniq("legacy")
    llm.script.push(Reply(text="legacy answer", match=text))
    settings = worker_settings("redis://unused", tmp_path)
    runner = TurnRunner(r, settings, ToolRegistry([]), router=lambda: build_router(settings),
                        hooks=hooks)
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=uniq("c")), text=text)
    queue.accept(r, msg)
    run_next(r, runner, msg.key.as_str())
    assert runs.get(r, msg.run_id).reply == "legacy answer"  # type: ignore[union-attr]
    req = sent_for(llm, text)
    assert (req["provider"], req["body"]["model"]) == ("anthropic", "claude-legacy")
    assert req["body"]["messages"][-1]["content"] in (
        f"[context for {text}]\n\n{text}",
        [{"type": "text", "text": f"[context for {text}]\n\n{text}"}])
