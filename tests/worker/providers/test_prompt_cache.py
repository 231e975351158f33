"""Prompt caching through the real SDKs and the scripted model, which reports cache reads and
writes as the APIs do (fermix_dev/scripted_llm/prompt_cache.py): Anthropic's ``cache_control``
breakpoints where they belong (never more than 4), a tool loop that reads its prefix from the
cache at every step, and a prompt whose per-turn values (the date note, recalled facts) come
after the cacheable part, so two turns on different days share it byte for byte."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anthropic
import openai
import pytest

from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_dev.scripted_llm.prompt_cache import OPENAI_INCREMENT
from fermix_dev.scripted_llm.script import ToolCallSpec
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_worker.providers.anthropic import AnthropicProvider
from fermix_worker.providers.anthropic_cache import EPHEMERAL, with_breakpoints
from fermix_worker.providers.base import ModelRequest, ModelTurn, Provider, ToolSpec
from fermix_worker.providers.openai import OpenAIProvider
from fermix_worker.turn.prepare import TurnInputs, prepare
from tests.fleet import uniq

# Long enough to be cached (both APIs cache prefixes of 1024 tokens and more).
RULES = "Follow the house rules: be brief, cite sources, and never guess a number. " * 80
TOOLS = [ToolSpec("lookup", "Look a thing up in the archive.",
                  {"type": "object", "properties": {"q": {"type": "string"}}})]


def adapter(llm: ScriptedLLMServer, provider: str, *, cache: bool = True) -> Provider:
    if provider == "anthropic":
        client = anthropic.Anthropic(api_key="k", base_url=llm.anthropic_base_url, max_retries=0)
        return AnthropicProvider(client, prompt_cache=cache)
    return OpenAIProvider(openai.OpenAI(api_key="k", base_url=llm.openai_base_url, max_retries=0))


def tool_turn(provider: Provider, llm: ScriptedLLMServer, request: ModelRequest, tag: str,
              steps: int = 5, committed: list[ChatMessage] | None = None) -> list[ModelTurn]:
    """A turn of ``steps`` model calls as the loop makes them: ``steps - 1`` tool rounds
    (chat, then continue_ from the adapter's state), then the answer; what the turn commits
    to history is added to ``committed``."""
    llm.script.push(*[Reply(tool_calls=[ToolCallSpec("lookup", {"q": f"{tag} {i}"}, id=f"t{i}")],
                            match=tag) for i in range(steps - 1)], Reply("done", match=tag))
    messages = list(request.messages)
    turns = [provider.chat(request, lambda _: None)]
    while turns[-1].tool_calls:
        call = turns[-1].tool_calls[0]
        result = ChatMessage(role="tool", tool_call_id=call.id, content=f"{call.arguments} " * 40)
        messages += [ChatMessage(role="assistant", content=turns[-1].content,
                                 tool_calls=turns[-1].tool_calls), result]
        turns.append(provider.continue_(turns[-1].provider_state, [result],
                                        replace(request, messages=messages), lambda _: None))
    assert len(turns) == steps
    if committed is not None:  # the user's message and what followed; not the turn's note
        committed += [request.messages[-1], *messages[len(request.messages):],
                      ChatMessage(role="assistant", content=turns[-1].content)]
    return turns


def bodies(llm: ScriptedLLMServer, tag: str) -> list[dict[str, Any]]:
    return [q["body"] for q in llm.script.requests if tag in json.dumps(q["body"])]


def marked(body: dict[str, Any]) -> list[str]:
    """Where the request's breakpoints are: ``tool``, ``system``, ``message <i>``."""
    where = [f"tool {i}" for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    system = body.get("system")
    where += ["system" for b in system if "cache_control" in b] if isinstance(system, list) else []
    for i, m in enumerate(body["messages"]):
        content = m["content"] if isinstance(m["content"], list) else []
        where += [f"message {i}" for b in content if "cache_control" in b]
    return where


def test_an_anthropic_tool_turn_reads_its_prefix_from_the_cache_at_every_step(
        llm: ScriptedLLMServer) -> None:
    tag = uniq("steps")
    request = ModelRequest(model="scripted-anthropic", system=f"{RULES} {tag}", tools=TOOLS,
                           messages=[ChatMessage(role="user", content=f"research {tag}")])
    turns = tool_turn(adapter(llm, "anthropic"), llm, request, tag)
    sent = bodies(llm, tag)
    # No history yet: the tool definitions, the system prompt and the newest message.
    assert [marked(b) for b in sent] == [
        ["tool 0", "system", f"message {len(b['messages']) - 1}"] for b in sent]
    assert all(b["system"][0]["cache_control"] == EPHEMERAL for b in sent)
    first, *later = turns
    assert first.cache_read_tokens == 0 and first.cache_write_tokens > 1024
    for before, turn in zip(turns, later, strict=False):
        # Everything the previous call sent is read; only what the step added is written.
        assert turn.cache_read_tokens >= before.input_tokens - 1
        assert 0 < turn.cache_write_tokens <= turn.input_tokens - before.input_tokens + 1
        assert turn.uncached_input_tokens < 10
    # The adapter's transcript, sent back by every continuation, carries no stale breakpoint.
    assert all("cache_control" not in json.dumps(t.provider_state) for t in turns)


def test_an_openai_tool_turn_reads_its_prefix_in_128_token_steps(llm: ScriptedLLMServer) -> None:
    tag = uniq("oai")
    request = ModelRequest(model="scripted-openai", system=f"{RULES} {tag}", tools=TOOLS,
                           messages=[ChatMessage(role="user", content=f"research {tag}")])
    turns = tool_turn(adapter(llm, "openai"), llm, request, tag)
    first, *later = turns
    assert first.cache_read_tokens == 0
    for before, turn in zip(turns, later, strict=False):
        # The previous call's whole prompt, in whole 128-token units.
        assert turn.cache_read_tokens % OPENAI_INCREMENT == 0
        assert before.input_tokens - OPENAI_INCREMENT < turn.cache_read_tokens <= before.input_tokens
    assert all("cache_control" not in json.dumps(b) for b in bodies(llm, tag))


def test_with_prompt_caching_off_anthropic_calls_carry_no_breakpoint_and_read_nothing(
        llm: ScriptedLLMServer) -> None:
    tag = uniq("off")
    request = ModelRequest(model="scripted-anthropic", system=f"{RULES} {tag}", tools=TOOLS,
                           messages=[ChatMessage(role="user", content=f"research {tag}")])
    turns = tool_turn(adapter(llm, "anthropic", cache=False), llm, request, tag)
    assert all("cache_control" not in json.dumps(b) for b in bodies(llm, tag))
    assert [(t.cache_read_tokens, t.cache_write_tokens) for t in turns] == [(0, 0)] * 5


def turn_request(tag: str, history: list[ChatMessage], now: datetime, facts: str = ""
                 ) -> ModelRequest:
    """A turn's first call as the loop makes it from :func:`prepare`."""
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=tag), text=f"more {tag}")
    state = prepare(TurnInputs(messages=[msg], history=history, prompt_base=f"{RULES} {tag}",
                               facts=facts, now=now, model="scripted"))
    return ModelRequest(model=state.model, system=state.system, messages=state.messages,
                        tools=TOOLS)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_two_turns_on_different_days_share_the_prompt_prefix_up_to_the_history_breakpoint(
        llm: ScriptedLLMServer, provider: str) -> None:
    tag = uniq("days")
    past = [ChatMessage(role="user", content=f"earlier {tag} " + "detail " * 200),
            ChatMessage(role="assistant", content="noted " * 100)]
    model = adapter(llm, provider)
    llm.script.push(Reply("one", match=tag), Reply("two", match=tag))
    model.chat(replace(turn_request(tag, past, datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
                                    facts="<memory>\n- [m1] likes tea\n</memory>"),
                       model=f"scripted-{provider}"), lambda _: None)
    second = model.chat(replace(turn_request(tag, past, datetime(2026, 12, 2, 17, 5, tzinfo=UTC)),
                                model=f"scripted-{provider}"), lambda _: None)
    one, two = bodies(llm, tag)
    # Up to the end of the history (Anthropic's breakpoint there), byte for byte the same.
    assert json.dumps(one.get("tools")) == json.dumps(two.get("tools"))
    assert json.dumps(one.get("system")) == json.dumps(two.get("system"))
    first_turn_messages = 2 if provider == "anthropic" else 3  # OpenAI: the system message first
    assert json.dumps(one["messages"][:first_turn_messages]) == \
        json.dumps(two["messages"][:first_turn_messages])
    # The per-turn values come after it: the date (and the first turn's recalled facts).
    assert "2026-12-01" in json.dumps(one["messages"][first_turn_messages:])
    assert "2026-12-02" in json.dumps(two["messages"][first_turn_messages:])
    assert "2026-12" not in json.dumps([one.get("system"), one["messages"][:first_turn_messages]])
    if provider == "anthropic":
        assert f"message {first_turn_messages - 1}" in marked(two)
    # The second turn reads the first one's prefix: system prompt and history (> 1024 tokens).
    assert second.cache_read_tokens > 1024


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_third_turn_reads_the_history_up_to_the_previous_turn_from_the_cache(
        llm: ScriptedLLMServer, provider: str) -> None:
    """Each turn's note is new, so a turn reads its history up to the previous turn's start
    (what that turn sent before its note) and pays for the previous turn's messages once."""
    tag = uniq("three")
    model, history = adapter(llm, provider), []
    firsts = []
    for day in (1, 2, 3):
        request = replace(turn_request(f"{tag}d{day}", history,
                                       datetime(2026, 12, day, 9, tzinfo=UTC)),
                          model=f"scripted-{provider}", system=f"{RULES} {tag}")
        firsts.append(tool_turn(model, llm, request, f"{tag}d{day}", 3, history)[0])
    one, two, three = firsts
    # Turn 2 reads the tools and system prompt only (turn 1 had no history before its note);
    # turn 3 reads them and turn 1, whatever the date and facts of each turn.
    assert two.cache_read_tokens < one.input_tokens
    assert three.cache_read_tokens > two.input_tokens - OPENAI_INCREMENT - 200


def test_breakpoints_go_to_the_newest_message_the_two_last_turn_ends_and_the_system_prompt(
        ) -> None:
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    loop = [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                               "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": "r"}]}]
    messages = [*turn, *turn, *turn, {"role": "user", "content": "now"}, *loop]
    tools = [{"name": "f", "description": "", "input_schema": {}}]
    system, marked_tools, sent = with_breakpoints("s", tools, messages)
    where = [i for i, m in enumerate(sent) if "cache_control" in json.dumps(m)]
    assert where == [3, 5, 8] and isinstance(system, list) and "cache_control" in system[0]
    assert "cache_control" not in json.dumps(marked_tools)  # four already: tools are in the prefix
    assert sent[8]["content"][0]["cache_control"] == EPHEMERAL  # the latest tool result
    assert "cache_control" not in json.dumps(messages)  # the caller's transcript is untouched
    # A call without tools (compaction, memory review) cannot be continued: no write at its end.
    _, _, one_off = with_breakpoints("s", [], [{"role": "user", "content": "summarize"}])
    assert "cache_control" not in json.dumps(one_off)
