"""Recall, not recency: a turn's prompt holds the facts most relevant to the user's message
(the seed's "Top 5 most relevant"), ranked by the embeddings API when an embedding model is
configured, by full text otherwise or when embeddings fail.

Turns run in this process (TurnRunner) on the scratch Redis, over the real SDK adapters
talking to the scripted LLM server, whose ``/v1/embeddings`` answers with hashed bags of words.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import Fail, ScriptedLLMServer
from fermix_dev.scripted_llm.embeddings_wire import vector
from fermix_shared import keys
from fermix_shared.audit import AuditLog
from fermix_shared.memory import Fact, MemoryStore
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.providers import build_router
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.tools.memory import memory_tools
from fermix_worker.turn import TurnRunner
from tests.conftest import provider_env
from tests.fleet import uniq
from tests.seed_text import quoted

# The seed's number, read from its words: "5, // Top 5 most relevant".
TOP = int(quoted("O", "5, // Top 5 most relevant").split(",")[0])
EMBEDDING_MODEL = "scripted-embedding"

GARDEN = [
    "The user grows cherry tomatoes in the garden.",
    "The user's garden gets sun all spring and summer.",
    "The user plants tomatoes every spring.",
    "The user lost the garden tomatoes to blight.",
    "The user waters the garden at dawn before work.",
]
UNRELATED = [
    "The user's sister is called Ana.", "The user drinks green tea.",
    "The user's laptop runs Debian.", "The user supports Olympique Lyonnais.",
    "The user's cat is named Miso.", "The user prefers metric units.",
    "The user is allergic to peanuts.", "The user commutes by bike.",
    "The user's manager is Priya.", "The user reads science fiction novels.",
    "The user plays chess on Sundays.", "The user owns a red kayak.",
    "The user dislikes long meetings.", "The user learns Japanese.",
    "The user's birthday is March 3.",
]


@pytest.fixture(autouse=True)
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


def settings(provider: str = "openai", **memory: Any) -> Settings:
    return Settings(redis_url="redis://unused", provider=provider, model=f"scripted-{provider}",
                    cancel_poll_seconds=0.05, memory=memory)


def remember(r: redis.Redis, texts: list[str]) -> list[Fact]:
    store = MemoryStore(r)
    return [store.add(t, "test") for t in texts]


def run_turn(r: redis.Redis, s: Settings, text: str) -> RunRecord:
    tools = ToolRegistry([*BUILTIN_TOOLS, *memory_tools(lambda: MemoryStore(r))])
    runner = TurnRunner(r, s, tools, router=lambda: build_router(s))
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=uniq("chat")),
                         text=text, trust="operator", sender_id="api")
    queue.accept(r, msg)
    claim, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    runner.run(claim.messages, lease)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status == "ok", rec
    return rec


def prompt_fact_ids(llm: ScriptedLLMServer, text: str) -> list[str]:
    """The ids in the memory section of the prompt the model got with ``text`` (in the turn's
    note after the history: an OpenAI system message, an Anthropic user text block)."""
    (body,) = [q["body"] for q in llm.script.requests if text in json.dumps(q["body"])]
    notes = "\n".join(
        part for m in body["messages"] if m["role"] != "assistant"
        for part in ([m["content"]] if isinstance(m["content"], str) else
                     [b["text"] for b in m["content"] if b.get("type") == "text"]))
    section = re.search(r"<memory>\n(.*?)\n</memory>", notes, re.DOTALL)
    assert section is not None, notes
    return re.findall(r"^- \[(m\d+)\]", section.group(1), re.MULTILINE)


def unshared(prefix: str) -> str:
    """A unique word pair (``uniq``) whose hashed coordinates no fact of the test uses: the
    fake embedding model hashes words into 256 coordinates, so a random id could otherwise
    land on an unrelated fact's word and outrank a garden fact, now and then."""
    facts = [vector(f) for f in GARDEN + UNRELATED]
    while True:
        u = uniq(prefix)
        v = vector(u)
        if all(sum(a * b for a, b in zip(v, f, strict=True)) == 0 for f in facts):
            return u


def embedding_inputs(llm: ScriptedLLMServer, text: str) -> list[list[str]]:
    """The inputs of each embeddings call that embedded ``text``."""
    return [q["body"]["input"] for q in llm.script.embedding_requests
            if text in q["body"]["input"]]


def ranking_of(r: redis.Redis, rec: RunRecord) -> Any:
    (read,) = [e for e in AuditLog(r).recent(run=rec.run_id, limit=100)
               if (e.kind, e.action) == ("memory", "prompt_read")]
    return read.detail["ranking"]


def test_full_text_recall_puts_the_relevant_facts_in_the_prompt_not_the_newest(
        r: redis.Redis, llm: ScriptedLLMServer) -> None:
    # Anthropic has no embeddings API: with no embedding model, recall ranks by full text.
    garden = remember(r, GARDEN)
    remember(r, UNRELATED)  # the newest 15 say nothing about the garden
    text = f"Which tomatoes should I plant in my garden this spring? {uniq('ft')}"
    rec = run_turn(r, settings("anthropic"), text)
    assert sorted(prompt_fact_ids(llm, text)) == sorted(f.id for f in garden)
    assert len(garden) == TOP == settings().memory.recall_top
    assert ranking_of(r, rec) == "full_text"
    assert embedding_inputs(llm, text) == []


def test_with_an_embedding_model_one_embeddings_call_ranks_the_facts(
        r: redis.Redis, llm: ScriptedLLMServer) -> None:
    garden = remember(r, GARDEN)
    remember(r, UNRELATED)
    # A model of its own: no vector cached by another test (the cache is per model).
    model = uniq(EMBEDDING_MODEL)
    s = settings(embedding_model=model)
    text = f"Which tomatoes should I plant in my garden this spring? {unshared('emb')}"
    rec = run_turn(r, s, text)
    assert sorted(prompt_fact_ids(llm, text)) == sorted(f.id for f in garden)
    assert ranking_of(r, rec) == "embedding"
    # One call: the message, and the 20 facts not embedded yet, in one batch.
    ((first, *facts),) = embedding_inputs(llm, text)
    assert first == text and sorted(facts) == sorted(GARDEN + UNRELATED)

    # The next turn embeds only its message, and a fact whose text changed.
    MemoryStore(r).replace(garden[4].id, "The user waters the garden tomatoes at dusk.")
    again = f"How often do my garden tomatoes need water? {unshared('emb')}"
    run_turn(r, s, again)
    assert embedding_inputs(llm, again) == [
        [again, "The user waters the garden tomatoes at dusk."]]
    assert garden[4].id in prompt_fact_ids(llm, again)
    # The old text's vector is gone: the cache holds the active facts' vectors only.
    assert r.hlen(keys.memory_vectors(model)) == len(GARDEN) + len(UNRELATED)


def test_an_embeddings_failure_falls_back_to_full_text_and_the_turn_goes_on(
        r: redis.Redis, llm: ScriptedLLMServer, caplog: pytest.LogCaptureFixture) -> None:
    garden = remember(r, GARDEN)
    remember(r, UNRELATED)
    token = uniq("down")
    llm.script.push(Fail(503, "embeddings are down", match=token))
    text = f"Which tomatoes should I plant in my garden this spring? {token}"
    with caplog.at_level(logging.WARNING, logger="fermix_worker.memory.recall"):
        rec = run_turn(r, settings(embedding_model=EMBEDDING_MODEL), text)
    assert rec.reply  # the user still got an answer
    assert [q["entry"] for q in llm.script.embedding_requests
            if token in json.dumps(q["body"])] == ["fail"]
    assert sorted(prompt_fact_ids(llm, text)) == sorted(f.id for f in garden)
    assert ranking_of(r, rec) == "full_text"
    assert "embeddings failed" in caplog.text and "embeddings are down" in caplog.text


def test_with_fewer_facts_than_the_top_all_of_them_are_in_the_prompt(
        r: redis.Redis, llm: ScriptedLLMServer) -> None:
    few = remember(r, UNRELATED[:TOP - 2])  # none about the message
    text = f"Which tomatoes should I plant in my garden this spring? {uniq('few')}"
    rec = run_turn(r, settings(embedding_model=EMBEDDING_MODEL), text)
    assert sorted(prompt_fact_ids(llm, text)) == sorted(f.id for f in few)
    assert ranking_of(r, rec) == "all"
    assert embedding_inputs(llm, text) == []  # nothing to choose between: no call
