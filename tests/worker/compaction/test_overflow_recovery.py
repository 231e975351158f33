"""Context overflow recovery as OpenFang describes it: the user sees "[context overflow,
recovering...]"; the turn's prompt is shrunk (oldest messages trimmed, long tool results cut,
remembered facts compressed) and the call retried, and the user gets the real answer.

TurnRunner runs in this process on a real Redis; the model is scripted in-process and raises
the provider's context-overflow error where the script says so."""

from __future__ import annotations

import json

import redis

from fermix_shared import keys
from fermix_shared.errors import ProviderUnavailable
from fermix_shared.memory.fact import Fact
from fermix_shared.memory.prompt_files import (
    COMPRESSED_FACT_CHARS,
    COMPRESSED_FACTS,
    compress_memory,
    memory_section,
)
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from fermix_shared.stores import history, runs
from fermix_worker.providers.base import ModelRequest, ModelTurn
from fermix_worker.tools import Tool, ToolRegistry
from fermix_worker.turn import Delivered, TurnRunner
from tests.fleet import uniq
from tests.seed_text import quoted
from tests.worker.approvals.test_park import Chat
from tests.worker.turn.test_runner import Model, claim, overflow, say

NOTICE = quoted("O", "[context overflow, recovering...]")


def runner_for(r: redis.Redis, model: Model, chat: Chat, tools: list[Tool] | None = None
               ) -> TurnRunner:
    s = Settings(redis_url="redis://unused", provider="openai", model="m")
    return TurnRunner(r, s, ToolRegistry(tools or []), router=lambda: model,  # type: ignore[arg-type, return-value]
                      channels=lambda name: chat if name == "telegram" else None)  # type: ignore[arg-type, return-value]


def events(r: redis.Redis, run_id: str) -> list[tuple[str, dict[str, object]]]:
    return [(f["stream"], json.loads(f["data"])) for _, f in r.xrange(keys.run_events(run_id))]


def summary_fails(request: ModelRequest) -> ModelTurn:
    raise ProviderUnavailable("the summary call failed", provider="openai")


def test_the_user_sees_the_notice_then_the_answer_and_the_oldest_messages_are_trimmed(
    r: redis.Redis,
) -> None:
    conv = ConversationKey(channel="telegram", chat_id=uniq("c"))
    old = [ChatMessage(role=role, content=f"{role} {i}")  # type: ignore[arg-type]
           for i in range(6) for role in ("user", "assistant")]
    history.append(r, conv.as_str(), old)
    chat = Chat()
    # The summary call fails too, so the oldest messages are dropped from the prompt outright.
    model = Model(overflow, summary_fails, say("answered after recovery"))
    msg, lease = claim(r, "one more", conv)
    assert runner_for(r, model, chat).run([msg], lease) == Delivered(waiting=0)
    assert chat.said == [NOTICE, "answered after recovery"]
    retried = [m.content for m in model.requests[-1].messages]
    # The newer half of the history, the turn's date note and its message; the oldest are gone.
    assert retried[:6] + retried[7:] == ["user 3", "assistant 3", "user 4", "assistant 4",
                                         "user 5", "assistant 5", "one more"]
    assert retried[6].startswith("Current date: ")
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "answered after recovery"
    assert ("diagnostic", {"kind": "context_overflow", "message": NOTICE}) in events(r, msg.run_id)
    # Stored history is untouched by the trim (only the prompt was shrunk).
    assert [m.content for m in history.load(r, conv.as_str(), 100)][:2] == ["user 0", "assistant 0"]


def test_long_tool_results_are_cut_before_the_retry(r: redis.Redis) -> None:
    big = "x" * 30_000
    dump = Tool("dump", "Dump.", {"type": "object", "properties": {}}, lambda ctx, args: big[:19_000])
    calls = lambda request: ModelTurn("", [ToolCall(id="d1", name="dump", arguments={})])  # noqa: E731
    model = Model(calls, overflow, say("done"))
    chat = Chat()
    msg, lease = claim(r, "dump it", ConversationKey(channel="telegram", chat_id=uniq("c")))
    assert runner_for(r, model, chat, [dump]).run([msg], lease) == Delivered(waiting=0)
    result = model.requests[-1].messages[-1]
    assert result.role == "tool" and len(result.content) < 5_000
    assert result.content.endswith("[cut to fit the context window]")
    assert chat.said == [NOTICE, "done"]


def test_remembered_facts_are_compressed() -> None:
    facts = [Fact(id=f"f{i}", text=f"fact {i} " + "detail " * 100, created_at=0, updated_at=0,
                  source="tool") for i in range(5)]
    system = "You are Fermix.\n\n" + memory_section(facts) + "\n\nToday is Tuesday."
    small = compress_memory(system)
    assert small.startswith("You are Fermix.") and small.endswith("Today is Tuesday.")
    kept = [ln for ln in small.splitlines() if ln.startswith("- [")]
    assert [ln.split("]")[0] for ln in kept] == ["- [f0", "- [f1", "- [f2"][:COMPRESSED_FACTS]
    assert all(len(ln) <= COMPRESSED_FACT_CHARS + 1 for ln in kept)
    assert "<memory>" in small and "</memory>" in small  # still fenced as data
    assert compress_memory(small) == small and compress_memory("no facts") == "no facts"
