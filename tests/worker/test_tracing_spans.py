"""The spans of model calls and tool calls, in process: the metered router over the real SDK
adapters and the scripted model (usage reported as the APIs do), the real tool registry, and
the SDK's in-memory exporter. What a trace backend shows of a call: the GenAI attributes
(provider, models, tokens with the cached ones, why the model stopped), its cost, a tool's
name and outcome, and how long an approved call waited; never a prompt or an argument."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail, ToolCallSpec, Usage
from fermix_shared import tracing
from fermix_shared.errors import ProviderError
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.provider_routes import ProviderRoute
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.scopes import Attribution
from fermix_worker.providers.base import ModelRequest
from fermix_worker.providers.routing import BoundRoute, RoutedProvider
from fermix_worker.tools.base import RunContext, Tool, ToolError, ToolRegistry
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import MeteredProvider, metered
from tests.fleet import uniq
from tests.worker.providers.test_reported_usage import adapter

SECRET_PROMPT = "my password is hunter2-secret"


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


def router(r: redis.Redis | None, llm: ScriptedLLMServer, provider: str, model: str,
           run_id: str) -> Any:
    route = ProviderRoute(f"{provider}/{model}", provider, model)  # type: ignore[arg-type]
    chain = RoutedProvider([BoundRoute(route, adapter(llm, provider))])
    if r is None:  # usage off
        return metered(chain, None)
    return MeteredProvider(chain, UsageMeter(r, PriceCatalog()),
                           Attribution("default", "http|c|root", "", run_id))


def chat(provider: Any, model: str) -> None:
    provider.chat(ModelRequest(model=model, system="s", max_tokens=1_000,
                               messages=[ChatMessage(role="user", content=SECRET_PROMPT)]),
                  lambda _: None)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_model_call_span_has_the_genai_attributes_tokens_cached_tokens_and_cost(
    r: redis.Redis, llm: ScriptedLLMServer, spans: InMemorySpanExporter
) -> None:
    run_id = uniq("run")
    llm.script.push(Reply("ok", usage=Usage(9_000, 500, cache_read=8_000, reasoning=200)))
    with tracing.span("fermix.turn") as turn:
        chat(router(r, llm, "openai", "gpt-4.1-mini", run_id), "gpt-4.1-mini")
    call = next(s for s in spans.get_finished_spans() if s.name == "chat gpt-4.1-mini")
    assert call.parent is not None and call.parent.span_id == turn.get_span_context().span_id
    a = attributes(call)
    assert a == {**a, "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                 "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4.1-mini",
                 "gen_ai.response.model": "gpt-4.1-mini", "gen_ai.usage.input_tokens": 9_000,
                 "gen_ai.usage.output_tokens": 500,
                 "gen_ai.usage.cache_read.input_tokens": 8_000,
                 "gen_ai.usage.reasoning.output_tokens": 200,
                 "gen_ai.response.finish_reasons": ("stop",), "fermix.run_id": run_id}
    # gpt-4.1-mini: $0.40/M input, $0.10/M cached, $1.60/M output (the pricing tests' numbers).
    assert a["fermix.cost_usd"] == pytest.approx((400 + 800 + 800) / 1e6)
    assert SECRET_PROMPT not in json.dumps(a)


def test_a_call_that_asks_for_tools_says_so_and_anthropic_says_why_it_stopped(
    r: redis.Redis, llm: ScriptedLLMServer, spans: InMemorySpanExporter
) -> None:
    llm.script.push(Reply(tool_calls=[ToolCallSpec("get_time", {})],
                          usage=Usage(1_200, 30, cache_read=1_000, cache_write=150)))
    chat(router(r, llm, "openai", "gpt-4.1-mini", uniq("run")), "gpt-4.1-mini")
    llm.script.push(Reply("done", usage=Usage(1_200, 30, cache_read=1_000, cache_write=150)))
    chat(router(r, llm, "anthropic", "claude-sonnet-4-5", uniq("run")), "claude-sonnet-4-5")
    openai_call, claude_call = spans.get_finished_spans()
    assert attributes(openai_call)["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert attributes(openai_call)["fermix.tool_calls"] == 1
    a = attributes(claude_call)
    assert (a["gen_ai.provider.name"], a["gen_ai.response.finish_reasons"]) == (
        "anthropic", ("end_turn",))
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.cache_read.input_tokens"],
            a["gen_ai.usage.cache_creation.input_tokens"]) == (1_200, 1_000, 150)
    assert a["fermix.cost_usd"] > 0


def test_with_usage_off_calls_are_traced_without_a_cost_and_a_failed_call_is_an_error(
    llm: ScriptedLLMServer, spans: InMemorySpanExporter
) -> None:
    llm.script.push(Reply("ok", usage=Usage(10, 2)), Fail(400, "bad request"))
    provider = router(None, llm, "openai", "gpt-4.1-mini", "")
    chat(provider, "gpt-4.1-mini")
    with pytest.raises(ProviderError):
        chat(provider, "gpt-4.1-mini")
    answered, failed = spans.get_finished_spans()
    assert attributes(answered)["gen_ai.usage.input_tokens"] == 10
    assert "fermix.cost_usd" not in attributes(answered)
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(failed)["error.type"].endswith("Error")
    assert "gen_ai.usage.input_tokens" not in attributes(failed)


def _boom(ctx: RunContext, args: dict[str, Any]) -> str:
    raise ToolError("no such file")


TOOLS = ToolRegistry([
    Tool("echo", "Echo.", {"type": "object"}, lambda ctx, args: f"said {args['text']}"),
    Tool("broken", "Fails.", {"type": "object"}, _boom),
])


def test_a_tool_call_span_names_the_tool_and_its_outcome_never_its_arguments(
    spans: InMemorySpanExporter,
) -> None:
    ctx = RunContext()
    with tracing.span("fermix.turn") as turn:
        assert not TOOLS.execute(ToolCall(id="c1", name="echo",
                                          arguments={"text": SECRET_PROMPT}), ctx).is_error
        assert TOOLS.execute(ToolCall(id="c2", name="broken"), ctx).is_error
        assert TOOLS.execute(ToolCall(id="c3", name="nope"), ctx).is_error
    ok, failed, unknown = [s for s in spans.get_finished_spans() if s.name != "fermix.turn"]
    assert [s.name for s in (ok, failed, unknown)] == [
        "execute_tool echo", "execute_tool broken", "execute_tool nope"]
    assert all(s.parent is not None and s.parent.span_id == turn.get_span_context().span_id
               for s in (ok, failed, unknown))
    a = attributes(ok)
    assert a == {**a, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "echo",
                 "gen_ai.tool.call.id": "c1", "fermix.tool.outcome": "ok"}
    assert a["fermix.tool.duration_ms"] >= 0 and ok.status.status_code is StatusCode.UNSET
    assert SECRET_PROMPT not in json.dumps(a)
    assert attributes(failed)["fermix.tool.outcome"] == "error"
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(unknown)["fermix.tool.outcome"] == "error"


def test_an_approved_call_says_how_long_it_waited_for_its_approval(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.approval_wait("c9", 42.25, "approved"):
        TOOLS.execute(ToolCall(id="c9", name="echo", arguments={"text": "x"}), RunContext())
        TOOLS.execute(ToolCall(id="c10", name="echo", arguments={"text": "y"}), RunContext())
    approved, other = spans.get_finished_spans()
    assert attributes(approved)["fermix.approval.wait_s"] == 42.25
    assert attributes(approved)["fermix.approval.answer"] == "approved"
    assert "fermix.approval.wait_s" not in attributes(other)
