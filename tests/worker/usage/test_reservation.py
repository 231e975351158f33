"""Budgets no turn can outrun: every model call reserves its worst case (the prompt as sent,
estimated, plus ``max_tokens``) against the budgets of its scopes before it is made, fleet-wide
and atomically, and settles to the provider-reported usage after it.

In this process on a real (private) Redis: a turn runs through the real TurnRunner and the
metered router over an adapter that answers from a script; racing reservations come from
threads with their own Redis clients, as workers on other hosts would."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from fermix_shared import keys
from fermix_shared.errors import BudgetCutOff
from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, RunStatus
from fermix_shared.settings import Settings
from fermix_shared.stores import runs
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import Budget
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.scopes import Attribution
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.turn import TurnRunner
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import prompt_tokens
from tests.fleet import uniq
from tests.worker.usage.test_budget import PRICES, router, spent, turn

STEPS = 10


class ToolLooper:
    """An adapter that asks for a calculator call ``STEPS - 1`` times, then answers; it reports
    the prompt's size as its input tokens and 10 output tokens, as a provider would."""

    name = "fake"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        # Each call's prompt as sent, estimated then (the loop's message list grows after).
        self.estimates: list[int] = []

    def continue_(self, provider_state: object, tool_results: object, opts: ModelRequest,
                  on_delta: OnDelta) -> ModelTurn:
        return self.chat(opts, on_delta)

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        self.requests.append(request)
        self.estimates.append(prompt_tokens(request))
        n = len(self.requests)
        calls = [] if n >= STEPS else [
            ToolCall(id=f"c{n}", name="calculator", arguments={"expression": f"{n}+1"})]
        return ModelTurn("done" if not calls else "", calls, input_tokens=self.estimates[-1],
                         output_tokens=10, model="priced-m")


def reserved_nothing(r: redis.Redis) -> bool:
    return (r.hlen(keys.usage_reservations()) == 0 and r.hlen(keys.usage_reserved()) == 0
            and r.zcard(keys.usage_reservation_expiry()) == 0)


def day_tokens(r: redis.Redis, key: ConversationKey) -> int:
    return spent(r, f"conversation:{key.as_str()}")[0].tokens


SETTINGS = Settings(provider="openai", model="priced-m", max_tokens=50)


def test_a_ten_step_tool_turn_with_a_budget_that_fits_three_steps_makes_exactly_three_calls(
    r: redis.Redis,
) -> None:
    meter = UsageMeter(r, PriceCatalog(PRICES))
    tools = ToolRegistry(BUILTIN_TOOLS)
    # What each step's prompt weighs, from the same turn run without a budget.
    free = ToolLooper()
    turn(r, TurnRunner(r, SETTINGS, tools, router=lambda: router(free, meter)),  # type: ignore[arg-type]
         ConversationKey(channel="telegram", chat_id=uniq("c")), "count for me")
    est = free.estimates
    assert len(est) == STEPS
    # Room for the third call's worst case after two settled calls, not for a fourth's.
    limit = sum(e + 10 for e in est[:2]) + est[2] + SETTINGS.max_tokens
    key = ConversationKey(channel="telegram", chat_id=uniq("c"))
    budgets.put(r, Budget(scope=f"conversation:{key.as_str()}", period="day", tokens=limit))
    capped = ToolLooper()
    msg = turn(r, TurnRunner(r, SETTINGS, tools, router=lambda: router(capped, meter)),  # type: ignore[arg-type]
               key, "count for me")
    assert len(capped.requests) == 3
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.error
    assert rec.error is not None and rec.error.startswith(
        "I stopped here: the next step could take up to ")
    assert rec.error.endswith(f", more than is left of this conversation's daily budget "
                              f"({day_tokens(r, key):,} of {limit:,} tokens used); it resets "
                              "at 00:00 UTC.")
    # Settled to what the provider reported; nothing is left reserved.
    (day,) = spent(r, f"conversation:{key.as_str()}")
    assert day.tokens == sum(e + 10 for e in est[:3]) and day.calls == 3
    assert reserved_nothing(r)


def test_twenty_racing_calls_against_a_budget_that_fits_five_reserve_five(
    r: redis.Redis, scratch_redis_url: str,
) -> None:
    who = Attribution("racer", "http|race|root", "http:race", "run1")
    budgets.put(r, Budget(scope="agent:racer", period="hour", tokens=5 * 1_000))
    got: list[str] = []
    start = threading.Barrier(20)

    def call() -> None:
        client = redis.Redis.from_url(scratch_redis_url, decode_responses=True)
        meter = UsageMeter(client, PriceCatalog(PRICES))
        start.wait()
        try:
            got.append(meter.reserve("priced-m", 900, 100, who))
        except BudgetCutOff as e:
            got.append(f"refused: {e}")
        finally:
            client.close()

    threads = [threading.Thread(target=call) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([g for g in got if not g.startswith("refused")]) == 5
    assert all("more than is left of this agent's hourly budget" in g for g in got
               if g.startswith("refused"))


def test_a_failed_call_releases_its_reservation_and_a_lapsed_one_is_released_for_it(
    r: redis.Redis,
) -> None:
    who = Attribution("lapser", "http|l|root", "http:l", "run1")
    budgets.put(r, Budget(scope="agent:lapser", period="day", tokens=1_000))
    clock = [time.time()]
    meter = UsageMeter(r, PriceCatalog(PRICES), clock=lambda: clock[0], hold_s=60)
    first = meter.reserve("priced-m", 500, 300, who)
    with pytest.raises(BudgetCutOff):  # 800 held: no room for another 800
        meter.reserve("priced-m", 500, 300, who)
    meter.release(first)  # the call failed: it gave its hold back
    assert reserved_nothing(r)
    meter.reserve("priced-m", 500, 300, who)  # its caller dies: never settled
    clock[0] += 61  # past its hold
    meter.charge(["priced-m"], 100, 10, who, meter.reserve("priced-m", 500, 300, who))
    assert reserved_nothing(r)
    assert spent(r, "agent:lapser")[0].tokens == 110
