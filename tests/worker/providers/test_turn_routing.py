"""Which model a turn really talks to: a ``before_model_resolve`` hook's choice of provider and
model, and the model that answered after a failover (what compaction measures against).

TurnRunner runs in this process on a real Redis, over the real SDK adapters talking to the
scripted LLM server; its request log shows where each call went."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail, Reply, Usage
from fermix_shared import metrics
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord
from fermix_shared.provider_routes import RouteConfig
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_worker.compaction.conversation import ConversationCompactor
from fermix_worker.providers import build_router
from fermix_worker.providers.base import Resending
from fermix_worker.tools import ToolRegistry
from fermix_worker.turn import TurnRunner
from tests.conftest import provider_env
from tests.fleet import uniq


@pytest.fixture
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


def run_turn(r: redis.Redis, settings: Settings, text: str, hooks: HookRegistry | None = None,
             router: Any = None, tools: ToolRegistry | None = None) -> tuple[str, RunRecord]:
    runner = TurnRunner(r, settings, tools or ToolRegistry([]),
                        router=router or (lambda: build_router(settings)), hooks=hooks)
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=uniq("chat")), text=text,
                         trust="operator")
    queue.accept(r, msg)
    claim, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    runner.run(claim.messages, lease)
    rec = runs.get(r, msg.run_id)
    assert rec is not None
    return msg.key.as_str(), rec


class PickClaude:
    def before_model_resolve(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert (payload["provider"], payload["model"]) == ("openai", "scripted-openai")
        return {"provider": "anthropic", "model": "claude-hooked"}


@pytest.mark.usefixtures("sdk_env")
def test_before_model_resolve_moves_the_call_to_another_provider_and_model(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    text = uniq("hooked")
    llm.script.push(Reply(text="from the hooked model", match=text))
    hooks = HookRegistry()
    hooks.register("pick-claude", PickClaude())
    settings = Settings(redis_url="redis://unused", provider="openai", model="scripted-openai")
    _, rec = run_turn(r, settings, text, hooks)
    assert rec.reply == "from the hooked model"
    sent = [q for q in llm.script.requests if text in str(q["body"]["messages"])]
    assert [(q["provider"], q["body"]["model"]) for q in sent] == [("anthropic", "claude-hooked")]


@pytest.mark.usefixtures("sdk_env")
def test_compaction_measures_against_the_model_that_answered_after_failover(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    text = uniq("failover")
    llm.script.push(Fail(status=404, message="no such model", match=text),
                    Reply(text="answered by the fallback", match=text,
                          usage=Usage(input_tokens=900, output_tokens=5)))
    settings = Settings(
        redis_url="redis://unused", provider="openai", model="big-window",
        routes=[RouteConfig(provider="openai", model="big-window"),
                RouteConfig(provider="openai", model="small-window")],
        context_windows={"big-window": 1_000_000, "small-window": 1_000},
    )
    conv, rec = run_turn(r, settings, text)
    assert rec.reply == "answered by the fallback"
    assert history.measurement(r, conv) == (900, "small-window")
    # 900 tokens is past 0.85 x 1,000 (the fallback's window), far from 0.85 x 1,000,000.
    assert ConversationCompactor(r, settings, lambda: build_router(settings)).needed(conv)


def provider_calls() -> dict[tuple[str, str], float]:
    """``fermix_provider_latency_seconds`` call counts by (provider, model), as the process's
    metrics endpoint renders them."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == "fermix_provider_latency_seconds_count":
                out[(sample.labels["provider"], sample.labels["model"])] = sample.value
    return out


@pytest.mark.usefixtures("sdk_env")
def test_every_model_call_of_a_turn_is_on_the_provider_latency_histogram(
    r: redis.Redis, llm: ScriptedLLMServer
) -> None:
    """Declared and documented, so observed: each attempt through the chain (the primary's
    refusal, then the fallback's answer) is one model call on the histogram."""
    text = uniq("latency")
    llm.script.push(Fail(status=404, message="no such model", match=text),
                    Reply(text="from the fallback", match=text))
    settings = Settings(
        redis_url="redis://unused", provider="openai", model="lat-primary",
        routes=[RouteConfig(provider="openai", model="lat-primary"),
                RouteConfig(provider="anthropic", model="lat-fallback")],
    )
    before = provider_calls()
    _, rec = run_turn(r, settings, text)
    assert rec.reply == "from the fallback"
    after = provider_calls()
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert grew == {("openai", "lat-primary"): 1, ("anthropic", "lat-fallback"): 1}


def test_the_main_turn_applies_the_configured_loop_guard(r: redis.Redis) -> None:
    from fermix_shared.messages import ToolCall
    from fermix_shared.settings import LoopGuardConfig
    from fermix_worker.providers.base import ModelTurn
    from fermix_worker.tools import BUILTIN_TOOLS

    same = ToolCall(id="c", name="current_time", arguments={})

    class Repeating(Resending):
        calls = 0

        def for_turn(self, **_: Any) -> Repeating:
            return self

        def complete(self, request: Any, on_delta: Any, *, initial: bool) -> ModelTurn:
            self.calls += 1
            return ModelTurn("", [same.model_copy(update={"id": f"c{self.calls}"})])

    model = Repeating()
    settings = Settings(redis_url="redis://unused", provider="openai", model="m",
                        loop_guard=LoopGuardConfig(window=4, warn_at=2, kill_at=3))
    _, rec = run_turn(r, settings, "loop", router=lambda: model, tools=ToolRegistry(BUILTIN_TOOLS))
    assert rec.status.value == "error"
    assert rec.error == ("Repeated tool call loop detected: current_time was called 3 times "
                         "with the same arguments.")
    assert model.calls == 3  # the seed's default (kill at 5) would have let it call 5 times
