"""Usage and budgets in the worker, in this process on a real (private) Redis: every model call
through the provider router is charged to whoever took the router (the turn, its compaction,
the memory review, a subagent or skill run for its parent), a new turn over a budget is
refused before any model call with its message kept, and the 80 % warning is sent once."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, Usage
from fermix_shared import keys
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage
from fermix_shared.models import Channel, ConversationKey, InboundMessage, RunRecord, RunStatus
from fermix_shared.provider_routes import ProviderRoute
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_shared.usage import budgets
from fermix_shared.usage import store as usage_store
from fermix_shared.usage.budgets import Budget
from fermix_shared.usage.prices import ModelPrice, PriceCatalog
from fermix_shared.usage.scopes import Attribution
from fermix_shared.usage.store import BucketRef, Totals
from fermix_worker.compaction.conversation import ConversationCompactor
from fermix_worker.compaction.step import CompactionStep
from fermix_worker.loop_state import LoopState
from fermix_worker.memory.reviewer import MemoryReviewer, QueueReview
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta
from fermix_worker.providers.routing import BoundRoute, RoutedProvider
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.runner import SubagentJob, SubagentRunner
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.tools.policy import ALL_POLICIES
from fermix_worker.turn import Delivered, TurnRunner
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.close import FAILED_MARKER
from fermix_worker.turn.listeners import TurnEnded, TurnListeners
from fermix_worker.usage.budgets import WarnOnBudget
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import MeteredProvider, metered
from tests.fleet import uniq

# 1 input token = $0.001, 1 output token = $0.002: a (1000, 500) call costs exactly $2.00.
PRICES = {"priced-m": ModelPrice(input=1000, output=2000),
          "scripted-openai": ModelPrice(input=1000, output=2000)}
PERIODS = ("hour", "day", "month")


class Adapter:
    """A provider adapter answering from a queue of (text, input, output) turns."""

    name = "fake"

    def __init__(self, *turns: tuple[str, int, int]):
        self.turns = list(turns)
        self.requests: list[ModelRequest] = []

    def continue_(self, provider_state: object, tool_results: object, opts: ModelRequest,
                  on_delta: OnDelta) -> ModelTurn:
        return self.chat(opts, on_delta)

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        self.requests.append(request)
        text, tokens_in, tokens_out = self.turns.pop(0)
        return ModelTurn(content=text, tool_calls=[], input_tokens=tokens_in,
                         output_tokens=tokens_out, model="priced-m-2025-01-01")


def router(adapter: Adapter, meter: UsageMeter) -> MeteredProvider:
    return MeteredProvider(RoutedProvider([BoundRoute(
        ProviderRoute("fake/priced-m", "openai", "priced-m"), adapter)]), meter)


@pytest.fixture
def meter(r: redis.Redis) -> UsageMeter:
    return UsageMeter(r, PriceCatalog(PRICES))


def spent(r: redis.Redis, *scopes: str, period: str = "day") -> list[Totals]:
    return usage_store.totals(r, [BucketRef(s, period, time.time()) for s in scopes])  # type: ignore[arg-type]


def scopes_of(key: ConversationKey, agent: str, user: str) -> list[str]:
    return ["total", f"agent:{agent}", f"conversation:{key.as_str()}", f"user:{user}"]


class Chat:
    """An outbound channel that records what it sent."""

    name: Channel = "telegram"

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        self.sent.append((delivery_id, text))

    def working(self, key: ConversationKey, message_id: str | None) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


def telegram(chat: str | None = None) -> ConversationKey:
    return ConversationKey(channel="telegram", chat_id=chat or uniq("c"))


def turn(r: redis.Redis, runner: TurnRunner, key: ConversationKey, text: str,
         sender: str = "42") -> InboundMessage:
    msg = InboundMessage(key=key, text=text, sender_id=sender, trust="operator")
    queue.accept(r, msg)
    claimed, lease = queue.claim(r, key.as_str(), "w:1", 30)
    assert lease is not None
    assert runner.run([claimed.messages[0]], lease) == Delivered(waiting=0)
    return msg


def test_every_call_of_a_turn_is_charged_to_its_agent_conversation_and_user(
    r: redis.Redis, meter: UsageMeter
) -> None:
    adapter = Adapter(("hi there", 1000, 500))
    runner = TurnRunner(r, Settings(provider="openai", model="priced-m"), ToolRegistry([]),
                        router=lambda: router(adapter, meter))
    key = telegram()
    turn(r, runner, key, "hello")
    for period in PERIODS:
        assert spent(r, *scopes_of(key, "default", "telegram:42"), period=period) == [
            Totals(1000, 500, 1, 2_000_000, 0)] * 4
    # A call with no attribution counts in total only; an unknown model counts $0, unpriced.
    meter.charge(("local-llama", ""), 10, 10, None)
    assert spent(r, "total", "agent:default") == [
        Totals(1010, 510, 2, 2_000_000, 1), Totals(1000, 500, 1, 2_000_000, 0)]


def test_a_budget_warns_once_at_80_percent_then_refuses_new_turns(
    r: redis.Redis, meter: UsageMeter
) -> None:
    budgets.put(r, Budget(scope="agent:default", period="day", usd_micros=2_400_000))
    adapter = Adapter(("first answer", 1000, 500), ("second answer", 1000, 500))
    chat = Chat()
    # Small calls (max_tokens 100): the second turn's worst case ($2.00 spent + at most
    # ~$0.21) fits the $2.40, so it runs, and its call goes past the limit.
    settings = Settings(provider="openai", model="priced-m", max_tokens=100)
    runner = TurnRunner(r, settings, ToolRegistry([]), router=lambda: router(adapter, meter),
                        channels=lambda name: chat if name == "telegram" else None,
                        listeners=TurnListeners([WarnOnBudget(r, settings, lambda n: chat)]))
    key = telegram()
    turn(r, runner, key, "one")  # $2.00 of $2.40: 83 %
    warning = ("Heads up: this agent has used 83% of its daily budget ($2.00 of $2.40). Once "
               "it is reached, new requests are refused until it resets at 00:00 UTC.")
    assert [text for _, text in chat.sent] == ["first answer", warning]
    turn(r, runner, key, "two")  # below the limit when it started: it runs, to $4.00
    assert [text for _, text in chat.sent][2:] == ["second answer"]  # warned once
    third = turn(r, runner, key, "three")
    refusal = ("This agent has reached its daily budget ($4.00 of $2.40 spent); "
               "it resets at 00:00 UTC.")
    rec = runs.get(r, third.run_id)
    assert rec is not None and (rec.status, rec.error) == (RunStatus.error, refusal)
    assert chat.sent[-1][1] == refusal and len(chat.sent) == 4  # no warning after it
    assert len(adapter.requests) == 2  # the refused turn called no model
    # As any failed turn: the user got the refusal, history the marker, not the refusal text.
    assert [m.content for m in history.load(r, key.as_str(), 100)][-2:] == ["three",
                                                                            FAILED_MARKER]
    refused = [json.loads(f["data"]) for _, f in r.xrange(keys.run_events(third.run_id))
               if json.loads(f["data"]).get("kind") == "budget"]
    assert refused == [{"kind": "budget", "phase": "refused", "scope": "agent:default",
                        "period": "day", "percent": 166.7}]


def test_a_compaction_is_charged_to_its_conversation(r: redis.Redis, meter: UsageMeter) -> None:
    key = telegram()
    history.append(r, key.as_str(), [ChatMessage(role=role, content=f"{role} {i}")
                                     for i in range(6) for role in ("user", "assistant")])
    settings = Settings(provider="openai", model="priced-m")
    adapter = Adapter(("the summary", 300, 100))
    step = CompactionStep(r, settings, ConversationCompactor(r, settings, lambda: router(adapter, meter)),
                          HookRegistry(), lambda *_: None)
    job = InboundMessage(key=key, text="/compact", sender_id="42", kind="compact",
                         compact_reason="command", agent="ops")
    assert step.compact(job, None, reason="command") is not None
    assert spent(r, *scopes_of(key, "ops", "telegram:42")) == [
        Totals(300, 100, 1, 500_000, 0)] * 4


def test_a_memory_review_is_charged_to_the_turns_scopes(
    r: redis.Redis, meter: UsageMeter, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, run_id = telegram(), f"run_{uuid.uuid4().hex}"
    state = LoopState.start(run_id=run_id, model="priced-m", system="s", history=[],
                            user=ChatMessage(role="user", content="I like tea"))
    state.messages.append(ChatMessage(role="assistant", content="Noted."))
    Checkpoints(r).save(state)
    adapter = Adapter(('{"add": [], "replace": [], "archive": []}', 400, 50))
    reviewer = MemoryReviewer(r, lambda: router(adapter, meter))
    assert reviewer.review_run(run_id, key.as_str(), "operator", agent="ops",
                               user="telegram:42") == "reviewed"
    assert spent(r, *scopes_of(key, "ops", "telegram:42")) == [Totals(400, 50, 1, 500_000, 0)] * 4

    # The post-turn listener queues the turn with its agent and user for the coalesced
    # review, which charges them (the last queued turn's).
    msg = InboundMessage(key=key, text="I like tea", sender_id="42", agent="ops")
    QueueReview(r, Settings())(TurnEnded(msg, RunRecord(
        run_id=msg.run_id, conversation=key, status=RunStatus.ok),
        committed=[ChatMessage(role="assistant", content="Noted.")]))
    queued = [json.loads(e) for e in r.lrange(keys.memory_pending(key.as_str()), 0, -1)]
    assert queued == [{"run_id": msg.run_id, "agent": "ops", "user": "telegram:42"}]


def _parent(r: redis.Redis, run_id: str) -> str:
    conv = f"telegram|{uuid.uuid4().hex}|root"
    r.hset(keys.active(conv), mapping={"turn_id": run_id, "worker": f"parked:{run_id}"})
    r.expire(keys.active(conv), 60)
    return conv


def test_subagents_and_skill_runs_are_charged_to_the_parent(
    r: redis.Redis, meter: UsageMeter, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    runner = SubagentRunner(r, Settings(provider="openai", model="scripted-openai",
                                        cancel_poll_seconds=0.05), BUILTIN_TOOLS, slot_wait_s=0.2,
                            meter=meter)
    conv = _parent(r, "run_p")
    for i, (skill, usage) in enumerate([("", Usage(200, 20)), ("triage", Usage(300, 30))]):
        task = f"task-{uuid.uuid4().hex[:8]}"
        llm.script.push(Reply(text="done", match=task, usage=usage))
        job = SubagentJob(
            fanout_id=uuid.uuid4().hex, index=i, task=task, conv=conv, parent_run="run_p",
            trust="operator", profile="default", result_format="concise", parent_model="m",
            parent_tools=None, parent_policies=sorted(ALL_POLICIES),
            concurrency=1, timeout_s=30, deadline_at=time.time() + 30, slots_ttl_s=60,
            skill=skill, system="You triage." if skill else None,
            parent_agent="ops", parent_user="telegram:42")
        out = runner.run(job, "w1")
        assert isinstance(out, SubagentReport) and out.status == "completed", out
    key = ConversationKey.parse(conv)
    assert spent(r, *scopes_of(key, "ops", "telegram:42")) == [
        Totals(500, 50, 2, 600_000, 0)] * 4


def test_a_metered_router_stays_metered_per_turn_and_with_a_hooks_route(
    r: redis.Redis, meter: UsageMeter
) -> None:
    # A turn's router (for_turn) and a before_model_resolve hook's chain (with_primary) are
    # charged as the process's router is, priced by the answering route's model; with usage
    # off there is no meter and the router is used as it is.
    hook_route = BoundRoute(ProviderRoute("fake/priced-m", "openai", "priced-m"),
                            Adapter(("hooked", 100, 50)))
    chain = router(Adapter(("plain", 200, 100)), meter)
    who = Attribution("ops", "http|c|root", "http:c", "run1")
    charged = chain.charged_to(who)
    for provider in (charged.for_turn(), charged.with_primary(hook_route).for_turn()):
        provider.complete(ModelRequest(model="m", system="s", messages=[]), lambda _: None,
                          initial=True)
    assert spent(r, "agent:ops") == [Totals(300, 150, 2, 600_000, 0)]
    plain = RoutedProvider([hook_route])
    assert metered(plain, None) is plain


def test_recording_from_many_threads_adds_up_exactly(r: redis.Redis, meter: UsageMeter) -> None:
    import threading

    n_threads, n_calls = 8, 100
    who = [Attribution(f"a{i % 2}", f"http|c{i}|root", f"http:c{i}", f"run{i}")
           for i in range(n_threads)]

    def work(i: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(n_calls):
                meter.charge(("priced-m", ""), 3, 1, who[i])  # $0.005
        return run

    threads = [threading.Thread(target=work(i)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    calls = n_threads * n_calls
    assert spent(r, "total", "agent:a0", "agent:a1", "conversation:http|c3|root") == [
        Totals(3 * calls, calls, calls, 5000 * calls, 0),
        *[Totals(3 * calls // 2, calls // 2, calls // 2, 5000 * calls // 2, 0)] * 2,
        Totals(3 * n_calls, n_calls, n_calls, 5000 * n_calls, 0)]
