"""The scripted model's prompt cache speaks as the real APIs do, through their SDKs: Anthropic
reads only at (or up to 19 blocks before) a breakpoint, refuses more than four, caches nothing
under 1024 tokens; OpenAI caches a repeated prefix of 1024 tokens or more in 128-token units."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from tests.fleet import uniq

LONG = "word " * 1200  # ~1500 tokens


def block(text: str, mark: bool = False) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": {"type": "ephemeral"}} if mark else {})}


def claude(llm: ScriptedLLMServer, system: list[dict[str, Any]], blocks: list[dict[str, Any]]
           ) -> Any:
    client = anthropic.Anthropic(api_key="k", base_url=llm.anthropic_base_url, max_retries=0)
    return client.messages.create(model="scripted", max_tokens=8, system=system,  # type: ignore[arg-type]
                                  messages=[{"role": "user", "content": blocks}]).usage  # type: ignore[typeddict-item]


def test_anthropic_reads_at_a_breakpoint_or_just_before_it_and_never_under_1024_tokens(
        llm: ScriptedLLMServer) -> None:
    tag = uniq("pc")
    system = [block(f"{tag} {LONG}", mark=True)]
    first = claude(llm, system, [block("a")])
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 1024
    # The same system prompt, another message: read at the system breakpoint.
    again = claude(llm, system, [block("b", mark=True)])
    assert again.cache_read_input_tokens == first.cache_creation_input_tokens
    # A mark is no part of the prefix: unmarked, the system prompt is found 1 block back.
    near = claude(llm, [block(f"{tag} {LONG}")], [block("c", mark=True)])
    assert near.cache_read_input_tokens == first.cache_creation_input_tokens
    # 25 blocks after a cached breakpoint, the lookback (20 boundaries) no longer finds it.
    far = claude(llm, [block(f"{tag} {LONG}")], [block(f"x{i}") for i in range(25)]
                 + [block("end", mark=True)])
    assert far.cache_read_input_tokens == 0 and far.cache_creation_input_tokens > 1024
    small = claude(llm, [block(f"{tag} short", mark=True)], [block("hi")])
    assert (small.cache_read_input_tokens, small.cache_creation_input_tokens) == (0, 0)


def test_anthropic_refuses_a_fifth_breakpoint_with_the_apis_400(llm: ScriptedLLMServer) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        claude(llm, [block("s", mark=True)], [block(f"b{i}", mark=True) for i in range(4)])
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in str(e.value)


def test_openai_caches_a_repeated_prefix_of_1024_tokens_or_more_in_128_token_units(
        llm: ScriptedLLMServer) -> None:
    client = openai.OpenAI(api_key="k", base_url=llm.openai_base_url, max_retries=0)
    tag = uniq("oai")

    def cached(system: str, user: str) -> tuple[int, int]:
        usage = client.chat.completions.create(model="scripted", messages=[
            {"role": "system", "content": system}, {"role": "user", "content": user}]).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return usage.prompt_tokens_details.cached_tokens or 0, usage.prompt_tokens

    assert cached(f"{tag} {LONG}", "one")[0] == 0
    read, prompt = cached(f"{tag} {LONG}", "two")
    assert read % 128 == 0 and prompt - 128 < read < prompt
    short = f"{tag} " + "word " * 300  # ~380 tokens: under 1024, never cached
    assert cached(short, "one")[0] == cached(short, "two")[0] == 0
    llm.script.reset()  # the cache goes with the script
    assert cached(f"{tag} {LONG}", "three")[0] == 0
