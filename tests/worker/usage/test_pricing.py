"""Calls priced as the provider bills them, on a real (private) Redis, through the metered
router, the real SDK adapters and the scripted model reporting usage as the APIs do: cached
input at the catalogue's cached rate (genai-prices' data), the operator's ``[prices]`` over
the catalogue, and a model neither knows counted as unknown, never as a silent $0."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_dev.scripted_llm.script import Usage
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.provider_routes import ProviderRoute
from fermix_shared.usage import store
from fermix_shared.usage.prices import ModelPrice, PriceCatalog
from fermix_shared.usage.scopes import Attribution
from fermix_shared.usage.store import BucketRef, Totals
from fermix_worker.providers.base import ModelRequest
from fermix_worker.providers.routing import BoundRoute, RoutedProvider
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import MeteredProvider
from tests.fleet import uniq
from tests.worker.providers.test_reported_usage import adapter

# 10,000 input tokens of which 8,000 read from the prompt cache and 1,000 written to it;
# 500 output tokens of which 200 spent reasoning.
CACHED = Usage(10_000, 500, cache_read=8_000, cache_write=1_000, reasoning=200)


def call(r: redis.Redis, llm: ScriptedLLMServer, provider: str, model: str, usage: Usage,
         catalog: PriceCatalog | None = None) -> Totals:
    """One metered call of ``model`` answered with ``usage``; what its agent was charged."""
    agent = uniq("a")
    route = ProviderRoute(f"{provider}/{model}", provider, model)
    router = MeteredProvider(RoutedProvider([BoundRoute(route, adapter(llm, provider))]),
                             UsageMeter(r, catalog or PriceCatalog()),
                             Attribution(agent, "", "", uniq("run")))
    llm.script.push(Reply("ok", usage=usage))
    router.chat(ModelRequest(model=model, system="s", max_tokens=1_000,
                             messages=[ChatMessage(role="user", content="hi")]), lambda _: None)
    (spent,) = store.totals(r, [BucketRef(f"agent:{agent}", "day", time.time())])
    return spent


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


def test_a_claude_call_with_cached_input_is_billed_at_the_cached_rates(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    # Claude Sonnet 4.5: $3/M input, $0.30/M cache read, $3.75/M cache write, $15/M output
    # (reasoning is output): 1,000 x 3 + 8,000 x 0.3 + 1,000 x 3.75 + 500 x 15 micro-dollars.
    spent = call(r, llm, "anthropic", "claude-sonnet-4-5", CACHED)
    assert spent == Totals(10_000, 500, 1, 3_000 + 2_400 + 3_750 + 7_500, 0,
                           cache_read_tokens=8_000, cache_write_tokens=1_000,
                           reasoning_tokens=200)


def test_an_openai_call_with_cached_input_is_billed_at_the_cached_rate(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    # gpt-4.1-mini: $0.40/M input, $0.10/M cached, $1.60/M output; OpenAI bills no cache
    # writes apart (the scripted model reports none: prompt_tokens holds all 9,000).
    usage = Usage(9_000, 500, cache_read=8_000, reasoning=200)
    spent = call(r, llm, "openai", "gpt-4.1-mini", usage)
    assert spent == Totals(9_000, 500, 1, 400 + 800 + 800, 0, cache_read_tokens=8_000,
                           reasoning_tokens=200)
    # Without the cache the same prompt costs its full input price.
    assert call(r, llm, "openai", "gpt-4.1-mini", Usage(9_000, 500)).usd_micros == 3_600 + 800


def test_the_operators_prices_override_the_catalogue(r: redis.Redis,
                                                     llm: ScriptedLLMServer) -> None:
    catalog = PriceCatalog({"claude-sonnet-4-5": ModelPrice(input=1, output=2, cache_read=0.5)})
    spent = call(r, llm, "anthropic", "claude-sonnet-4-5", CACHED, catalog)
    # No cache_write price: writes cost the input price.
    assert spent.usd_micros == 1_000 * 1 + 8_000 * 0.5 + 1_000 * 1 + 500 * 2


def test_a_model_no_catalogue_knows_is_counted_unknown_not_priced_at_zero_silently(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    spent = call(r, llm, "openai", "house-llama-70b", Usage(1_000, 100))
    assert (spent.tokens, spent.usd_micros, spent.unpriced_calls) == (1_100, 0, 1)
    assert r.hgetall(keys.usage_unpriced()) == {"house-llama-70b": "1"}


def test_tokens_and_cost_are_counted_for_prometheus_by_agent_and_model(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    """``fermix_tokens_total{agent,model,kind}`` and ``fermix_cost_usd_total{agent,model}`` on
    the worker's metrics: the same call, the same numbers as its usage record."""
    from prometheus_client import REGISTRY

    agent = uniq("a")
    route = ProviderRoute("anthropic/claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5")
    router = MeteredProvider(RoutedProvider([BoundRoute(route, adapter(llm, "anthropic"))]),
                             UsageMeter(r, PriceCatalog()), Attribution(agent, "", "", uniq("run")))
    for _ in range(2):
        llm.script.push(Reply("ok", usage=CACHED))
        router.chat(ModelRequest(model="claude-sonnet-4-5", system="s", max_tokens=1_000,
                                 messages=[ChatMessage(role="user", content="hi")]),
                    lambda _: None)

    def tokens(kind: str) -> float | None:
        return REGISTRY.get_sample_value("fermix_tokens_total", {
            "agent": agent, "model": "claude-sonnet-4-5", "kind": kind})

    assert [tokens(k) for k in ("input", "output", "cache_read", "cache_write", "reasoning")] \
        == [20_000, 1_000, 16_000, 2_000, 400]
    cost = REGISTRY.get_sample_value("fermix_cost_usd_total",
                                     {"agent": agent, "model": "claude-sonnet-4-5"})
    assert cost == pytest.approx(2 * (3_000 + 2_400 + 3_750 + 7_500) / 1e6)
