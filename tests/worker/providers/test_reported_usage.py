"""Usage as the providers report it, through the real SDKs against the scripted model: cache
reads and writes and reasoning tokens reach :class:`ModelTurn` in one meaning for both
adapters (``input_tokens`` every input token, cached ones included), though Anthropic's wire
counts the cache apart from ``input_tokens`` and OpenAI's inside ``prompt_tokens``."""

from __future__ import annotations

import anthropic
import openai
import pytest

from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_dev.scripted_llm.script import Usage
from fermix_shared.messages import ChatMessage
from fermix_worker.providers.anthropic import AnthropicProvider
from fermix_worker.providers.base import ModelRequest, Provider
from fermix_worker.providers.openai import OpenAIProvider

REQUEST = ModelRequest(model="m", system="s", max_tokens=512,
                       messages=[ChatMessage(role="user", content="hello")])


def adapter(llm: ScriptedLLMServer, provider: str) -> Provider:
    if provider == "anthropic":
        return AnthropicProvider(anthropic.Anthropic(
            api_key="k", base_url=llm.anthropic_base_url, max_retries=0))
    return OpenAIProvider(openai.OpenAI(api_key="k", base_url=llm.openai_base_url,
                                        max_retries=0))


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_cache_reads_writes_and_reasoning_reach_the_model_turn(provider: str) -> None:
    with ScriptedLLMServer() as llm:
        llm.script.push(Reply("hi", usage=Usage(1_200, 300, cache_read=1_000, cache_write=150,
                                                reasoning=120)))
        turn = adapter(llm, provider).chat(REQUEST, lambda _: None)
    assert (turn.input_tokens, turn.cache_read_tokens, turn.cache_write_tokens,
            turn.uncached_input_tokens) == (1_200, 1_000, 150, 50)
    assert (turn.output_tokens, turn.reasoning_tokens) == (300, 120)


def test_each_wire_counts_the_cache_as_its_api_does() -> None:
    """What the adapters add up: Anthropic's ``input_tokens`` leaves the cache out, OpenAI's
    ``prompt_tokens`` has it in."""
    with ScriptedLLMServer() as llm:
        usage = Usage(1_200, 300, cache_read=1_000, cache_write=150, reasoning=120)
        llm.script.push(Reply("a", usage=usage), Reply("b", usage=usage))
        message = anthropic.Anthropic(api_key="k", base_url=llm.anthropic_base_url).messages \
            .create(model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}])
        chat = openai.OpenAI(api_key="k", base_url=llm.openai_base_url).chat.completions \
            .create(model="m", messages=[{"role": "user", "content": "x"}])
    u = message.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (
        50, 1_000, 150)
    assert u.output_tokens_details is not None and u.output_tokens_details.thinking_tokens == 120
    c = chat.usage
    assert c is not None and c.prompt_tokens_details and c.completion_tokens_details
    assert (c.prompt_tokens, c.prompt_tokens_details.cached_tokens,
            c.completion_tokens_details.reasoning_tokens) == (1_200, 1_000, 120)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_call_without_cache_reports_no_cache_tokens(provider: str) -> None:
    with ScriptedLLMServer() as llm:
        llm.script.push(Reply("hi", usage=Usage(40, 7)))
        turn = adapter(llm, provider).chat(REQUEST, lambda _: None)
    assert (turn.input_tokens, turn.output_tokens, turn.cache_read_tokens,
            turn.cache_write_tokens, turn.reasoning_tokens) == (40, 7, 0, 0, 0)
