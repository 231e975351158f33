"""The token-rate breaker: an agent's calls may take at most N tokens a minute, fleet-wide,
counted at reservation (the call's worst case) and settled to what the provider reported. In
this process on a real (private) Redis, with an injected clock: a loop of fast tool calls is
refused past the rate with a reply naming it and when it frees up."""

from __future__ import annotations

import pytest
import redis

from fermix_shared.errors import BudgetCutOff
from fermix_shared.models import ConversationKey, RunStatus
from fermix_shared.settings import Settings
from fermix_shared.stores import runs
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.rate import rates_of
from fermix_shared.usage.scopes import Attribution
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.turn import TurnRunner
from fermix_worker.usage.meter import UsageMeter
from tests.fleet import uniq
from tests.worker.usage.test_budget import PRICES, router, turn
from tests.worker.usage.test_reservation import SETTINGS, STEPS, ToolLooper, reserved_nothing

# 2025-12-01 10:00:15 UTC: 45 seconds left in the minute.
T0 = 1_764_583_215.0


def test_a_loop_of_fast_calls_is_refused_past_its_agents_tokens_per_minute(
    r: redis.Redis,
) -> None:
    clock = [T0]
    tools = ToolRegistry(BUILTIN_TOOLS)
    # What each step's prompt weighs, from the same turn run without a rate.
    free = ToolLooper()
    turn(r, TurnRunner(r, SETTINGS, tools, router=lambda: router(
        free, UsageMeter(r, PriceCatalog(PRICES)))),  # type: ignore[arg-type]
         ConversationKey(channel="telegram", chat_id=uniq("c")), "count for me")
    est = free.estimates
    assert len(est) == STEPS
    # Room for two settled calls (each its prompt + 10 output tokens, not its 50 max_tokens)
    # and the third's worst case, not a fourth's.
    rate = sum(e + 10 for e in est[:2]) + est[2] + SETTINGS.max_tokens
    meter = UsageMeter(r, PriceCatalog(PRICES), clock=lambda: clock[0], rates={"default": rate})
    looper = ToolLooper()
    msg = turn(r, TurnRunner(r, SETTINGS, tools, router=lambda: router(looper, meter)),  # type: ignore[arg-type]
               ConversationKey(channel="telegram", chat_id=uniq("c")), "count for me")
    assert len(looper.requests) == 3
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status is RunStatus.error
    taken = sum(e + 10 for e in est[:3])
    assert rec.error == (
        f"I stopped here: this agent is limited to {rate:,} tokens a minute, {taken:,} are "
        f"taken this minute and the next step could take up to {est[3] + 50:,} more; it frees "
        f"up at 10:01:00 UTC (in 45 seconds).")
    assert reserved_nothing(r)

    # Another agent has its own minute; this one's frees up with the next minute.
    who = Attribution("default", "http|x|root", "http:x", "run2")
    with pytest.raises(BudgetCutOff):
        meter.reserve("priced-m", est[3], 50, who)
    meter.release(meter.reserve("priced-m", est[3], 50, Attribution("ops", "", "", "run3")))
    clock[0] = T0 + 45
    meter.charge(["priced-m"], est[3], 10, who, meter.reserve("priced-m", est[3], 50, who))


def test_a_minute_with_nothing_counted_takes_one_call_larger_than_the_rate(
    r: redis.Redis,
) -> None:
    clock = [T0]
    meter = UsageMeter(r, PriceCatalog(PRICES), clock=lambda: clock[0], default_rate=1_000)
    who = Attribution("big", "http|b|root", "http:b", "run1")
    # A prompt alone above the rate still makes one call a minute (else the agent never could).
    meter.charge(["priced-m"], 3_000, 10, who, meter.reserve("priced-m", 3_000, 100, who))
    with pytest.raises(BudgetCutOff, match="limited to 1,000 tokens a minute, 3,010 are taken"):
        meter.reserve("priced-m", 10, 10, who)
    # A failed call gives its tokens back to the minute.
    clock[0] = T0 + 60
    meter.release(meter.reserve("priced-m", 600, 300, who))
    meter.reserve("priced-m", 600, 300, who)
    assert reserved_nothing(r) is False


def test_an_agents_own_rate_overrides_the_default() -> None:
    settings = Settings(agents=[{"name": "ops", "tokens_per_minute": 500}, {"name": "web"}],
                        usage={"agent_tokens_per_minute": 20_000})
    assert rates_of(settings.agents, settings.usage.agent_tokens_per_minute) == {
        "ops": 500, "web": 20_000}
    assert rates_of(Settings(agents=[{"name": "web"}]).agents, None) == {}
