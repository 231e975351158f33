"""Usage: the price catalog and its overrides, UTC buckets and reset times, scopes, counting a
call in Redis (exactly, from many threads at once), and budgets with their texts and the
warn-once mark."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

from fermix_shared import keys
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.usage import budgets, store
from fermix_shared.usage.budgets import Budget, BudgetStatus
from fermix_shared.usage.periods import (
    bucket_id,
    expire_at,
    next_start,
    recent,
    reset_phrase,
    start_of,
)
from fermix_shared.usage.prices import ModelPrice, PriceCatalog, cost_micros
from fermix_shared.usage.scopes import (
    parse_scope,
    turn_scopes,
    user_of,
)
from fermix_shared.usage.store import BucketRef, Totals


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# Buckets in Redis expire a while after they end: tests that store them use days to come (the
# 10th of next month), never past ones.
SOON = next_start("month", time.time()) + timedelta(days=9)


# --- prices --------------------------------------------------------------------------------------

# A day the catalogue's prices are dated at (prices change over time; the call's own date
# picks them).
PRICED_AT = at("2026-06-01T12:00").timestamp()


def test_the_catalogue_prices_the_default_and_common_models_and_their_snapshots() -> None:
    catalog = PriceCatalog()
    for model in ("gpt-4.1-mini", "gpt-4.1", "gpt-4o", "gpt-4o-mini", "o3", "gpt-5",
                  "claude-sonnet-4-5", "claude-opus-4-1", "claude-haiku-4-5"):
        got = catalog.price([model], 1000, 100, when=PRICED_AT)
        assert (got.model, got.priced, got.source) == (model, True, "catalogue")
        assert got.usd_micros > 0
    # Snapshots and aliases are priced as their model. USD per million tokens is micro-dollars
    # per token: gpt-4.1-mini is $0.40 in, $1.60 out; Claude Sonnet 4.5 $3 and $15.
    assert catalog.price(["gpt-4.1-mini"], 1000, 500, when=PRICED_AT).usd_micros == 400 + 800
    snap = catalog.price(["claude-sonnet-4-5-20250929"], 1000, 500, when=PRICED_AT)
    assert (snap.model, snap.usd_micros) == ("claude-sonnet-4-5", 3000 + 7500)
    assert catalog.price(["gpt-4o-mini-2024-07-18"], 1000, 0).model == "gpt-4o-mini"
    assert cost_micros(ModelPrice(input=3, output=15), 1_000_000, 1_000_000) == 18_000_000


def test_cached_input_and_long_prompts_are_priced_as_the_provider_bills_them() -> None:
    catalog = PriceCatalog()
    # Claude Sonnet 4.5: 10,000 input tokens, 8,000 read from the cache ($0.30/M) and 1,000
    # written to it ($3.75/M), the other 1,000 at $3/M; 500 out at $15/M.
    got = catalog.price(["claude-sonnet-4-5"], 10_000, 500, cache_read=8_000,
                        cache_write=1_000, when=PRICED_AT)
    assert got.usd_micros == 3_000 + 2_400 + 3_750 + 7_500
    # gpt-4.1-mini: 8,000 of 10,000 prompt tokens cached ($0.10/M), 2,000 at $0.40/M.
    got = catalog.price(["gpt-4.1-mini"], 10_000, 500, cache_read=8_000, when=PRICED_AT)
    assert got.usd_micros == 800 + 800 + 800
    # A prompt past 200k tokens is billed at Claude's long-context rates ($6 in, $22.50 out).
    got = catalog.price(["claude-sonnet-4-5"], 300_000, 1_000, when=PRICED_AT)
    assert got.usd_micros == 1_800_000 + 22_500


def test_pricing_never_touches_the_network() -> None:
    """genai-prices bundles its data; its updater (the one thing that downloads) is opt-in:
    importing the catalogue and pricing calls opens no connection and resolves no name."""
    code = (
        "import sys\n"
        "seen = []\n"
        "sys.addaudithook(lambda e, a: seen.append(e) if e.startswith('socket.') else None)\n"
        "from fermix_shared.usage.prices import PriceCatalog\n"
        "c = PriceCatalog()\n"
        "assert c.price(['claude-sonnet-4-5'], 10, 10).priced\n"
        "assert not c.price(['no-such-model-x'], 10, 10).priced\n"
        "import threading; assert threading.active_count() == 1, threading.enumerate()\n"
        "print(seen)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_overrides_replace_and_add_prices_from_toml_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "fermix.toml"
    toml.write_text('[prices."gpt-4.1-mini"]\ninput = 1.0\noutput = 2.0\n\n'
                    '[prices."my-vllm"]\ninput = 0\noutput = 0.5\n')
    monkeypatch.setenv("FERMIX_CONFIG", str(toml))
    catalog = PriceCatalog(Settings().prices)
    overridden = catalog.price(["gpt-4.1-mini"], 1000, 1000)
    assert (overridden.usd_micros, overridden.source) == (3000, "override")
    # Without a cache_read price cached input costs the override's input price.
    assert catalog.price(["gpt-4.1-mini"], 1000, 0, cache_read=800).usd_micros == 1000
    assert catalog.price(["my-vllm"], 1000, 1000).usd_micros == 500
    assert catalog.price(["gpt-4o"], 1000, 0, when=PRICED_AT).usd_micros == 2500  # catalogue
    # An override of the reported snapshot wins over the catalogue's price of the alias.
    monkeypatch.setenv("FERMIX_PRICES", '{"claude-sonnet-4-5": {"input": 1, "output": 2, '
                                        '"cache_read": 0.5, "cache_write": 1.5}}')
    catalog = PriceCatalog(Settings().prices)
    got = catalog.price(["claude-sonnet-4-5-20250929"], 1000, 100, cache_read=400,
                        cache_write=200)
    assert (got.model, got.usd_micros) == ("claude-sonnet-4-5", 400 + 200 + 300 + 200)
    monkeypatch.setenv("FERMIX_PRICES", '{"gpt-4o": {"input": 10, "output": 20}}')
    assert PriceCatalog(Settings().prices).price(["gpt-4o"], 1000, 0).usd_micros == 10_000
    with pytest.raises(ValueError):
        ModelPrice(input=-1, output=0)


def test_an_unknown_model_is_unpriced_and_warned_about_once(
    caplog: pytest.LogCaptureFixture
) -> None:
    catalog = PriceCatalog()
    with caplog.at_level(logging.WARNING, "fermix_shared.usage.prices"):
        first = catalog.price(["local-llama", "llama-3-8b"], 1000, 1000)
        catalog.price(["local-llama", ""], 5, 5)
    assert (first.model, first.usd_micros, first.priced) == ("local-llama", 0, False)
    assert [r.getMessage() for r in caplog.records].count(
        caplog.records[0].getMessage()) == 1 and len(caplog.records) == 1
    assert "no price for model 'local-llama'" in caplog.records[0].getMessage()
    # The provider-reported id prices a call whose configured id is unknown.
    assert catalog.price(["my-alias", "gpt-4o"], 1000, 0).model == "gpt-4o"


# --- periods -------------------------------------------------------------------------------------

def test_buckets_and_resets_at_hour_day_and_month_boundaries() -> None:
    t = at("2025-03-07T14:59:59.999")
    assert [bucket_id(p, t) for p in ("hour", "day", "month")] == [
        "2025-03-07T14", "2025-03-07", "2025-03"]
    assert bucket_id("hour", at("2025-03-07T15:00:00")) == "2025-03-07T15"
    assert next_start("hour", t) == at("2025-03-07T15:00")
    assert next_start("day", at("2025-03-07T23:59:59")) == at("2025-03-08T00:00")
    assert next_start("day", at("2025-03-08T00:00:00")) == at("2025-03-09T00:00")
    assert next_start("month", at("2025-12-31T23:30")) == at("2026-01-01T00:00")
    assert next_start("month", at("2024-02-29T12:00")) == at("2024-03-01T00:00")
    # Another time zone is the same instant: buckets are UTC.
    local = at("2025-03-07T23:30").astimezone(timezone(timedelta(hours=5)))  # 8 March there
    assert bucket_id("day", local) == "2025-03-07"
    assert bucket_id("day", at("2025-03-07T23:30").timestamp()) == "2025-03-07"
    with pytest.raises(ValueError):
        start_of("day", datetime(2025, 3, 7))  # naive


def test_reset_phrases_and_retention() -> None:
    assert reset_phrase("hour", at("2025-03-07T14:20")) == "at 15:00 UTC"
    assert reset_phrase("day", at("2025-03-07T14:20")) == "at 00:00 UTC"
    assert reset_phrase("month", at("2025-03-07T14:20")) == "on 1 April at 00:00 UTC"
    assert reset_phrase("month", at("2025-12-07T14:20")) == "on 1 January at 00:00 UTC"
    assert recent("month", at("2025-02-10T00:00"), 3) == [
        at("2025-02-01T00:00"), at("2025-01-01T00:00"), at("2024-12-01T00:00")]
    assert recent("hour", at("2025-03-07T00:10"), 2) == [
        at("2025-03-07T00:00"), at("2025-03-06T23:00")]
    t = at("2025-03-07T14:20")
    assert expire_at("hour", t) == int((at("2025-03-07T15:00") + timedelta(days=3)).timestamp())
    assert expire_at("day", t) == int((at("2025-03-08T00:00") + timedelta(days=100)).timestamp())
    assert expire_at("month", t) == int((at("2025-04-01T00:00") + timedelta(days=730)).timestamp())


# --- scopes --------------------------------------------------------------------------------------

def test_scopes_as_people_write_them() -> None:
    assert parse_scope("total") == "total"
    assert parse_scope("agent:ops") == "agent:ops"
    assert parse_scope("conversation:telegram:42") == "conversation:telegram|42|root"
    assert parse_scope("conversation:slack|C1|1700.1") == "conversation:slack|C1|1700.1"
    assert parse_scope("user:slack:U042") == "user:slack:U042"
    for bad in ("agent:OPS", "agent:", "conversation:irc:1", "conversation:a|b", "user:U042",
                "team:x", "everything"):
        with pytest.raises(ValueError):
            parse_scope(bad)


def test_who_a_message_is_charged_to() -> None:
    tg = InboundMessage(key=ConversationKey(channel="telegram", chat_id="-100", thread_scope="7"),
                        text="hi", sender_id="42", agent="ops")
    assert turn_scopes(tg) == ["total", "agent:ops", "conversation:telegram|-100|7",
                               "user:telegram:42"]
    http = InboundMessage(key=ConversationKey(channel="http", chat_id="c9"), text="hi")
    assert user_of(http) == "http:c9"
    job = InboundMessage(key=ConversationKey(channel="schedule", chat_id="daily", thread_scope="r1"),
                         text="report", sender_id="schedule:daily", context="scheduled")
    assert user_of(job) == "schedule:daily"


# --- counting in Redis ---------------------------------------------------------------------------

def expires(r: redis.Redis, key: str) -> int:
    """When ``key`` expires, to the second (EXPIRETIME needs Redis 7)."""
    return round(time.time() + r.pttl(key) / 1000)


SCOPES = ["total", "agent:ops", "conversation:http|c|root", "user:http:c"]


def test_a_call_counts_in_every_scope_and_period_with_expiry(r: redis.Redis) -> None:
    t = (SOON - timedelta(seconds=30)).timestamp()  # 23:59:30 on the 9th
    store.record(r, SCOPES, 1000, 500, 1_250_000, "", t)
    store.record(r, SCOPES[:2], 10, 5, 0, "local-llama", t + 60)  # the next day, same month
    day1 = store.totals(r, [BucketRef(s, "day", t) for s in SCOPES])
    assert day1 == [Totals(1000, 500, 1, 1_250_000, 0)] * 4
    assert store.totals(r, [BucketRef("agent:ops", "day", t + 60)]) == [Totals(10, 5, 1, 0, 1)]
    assert store.totals(r, [BucketRef(s, "month", t) for s in SCOPES]) == [
        Totals(1010, 505, 2, 1_250_000, 1)] * 2 + [Totals(1000, 500, 1, 1_250_000, 0)] * 2
    assert r.hgetall(keys.usage_unpriced()) == {"local-llama": "1"}
    assert expires(r, keys.usage("hour", bucket_id("hour", t))) == expire_at("hour", t)
    assert expires(r, keys.usage("month", bucket_id("month", t))) == expire_at("month", t + 60)
    agents = store.bucket_scopes(r, "day", t, "agent")
    assert agents == {"agent:ops": Totals(1000, 500, 1, 1_250_000, 0)}


def test_many_threads_recording_add_up_exactly(r: redis.Redis) -> None:
    threads, calls = 8, 200
    t = SOON.timestamp()

    def work() -> None:
        client = redis.Redis(connection_pool=r.connection_pool)
        for _ in range(calls):
            store.record(client, SCOPES, 7, 3, 11, "", t)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    n = threads * calls
    for period in ("hour", "day", "month"):
        assert store.totals(r, [BucketRef(s, period, t) for s in SCOPES]) == [
            Totals(7 * n, 3 * n, n, 11 * n, 0)] * 4


# --- budgets -------------------------------------------------------------------------------------

def status(scope: str, period: str, *, usd: float | None = None, tokens: int | None = None,
           spent_usd: float = 0, spent_tokens: int = 0,
           when: datetime | None = None) -> BudgetStatus:
    b = Budget(scope=scope, period=period,  # type: ignore[arg-type]
               usd_micros=None if usd is None else budgets.usd_micros(usd), tokens=tokens)
    return BudgetStatus(b, Totals(spent_tokens, 0, 1, round(spent_usd * 1e6)),
                        when or at("2025-03-07T14:20"))


def test_the_refusal_says_which_limit_and_when_it_resets() -> None:
    assert budgets.refusal_text(status("agent:ops", "day", usd=5, spent_usd=5)) == (
        "This agent has reached its daily budget ($5.00 of $5.00 spent); "
        "it resets at 00:00 UTC.")
    assert budgets.refusal_text(status("user:telegram:42", "month", usd=20, spent_usd=20.5)) == (
        "You have reached your monthly budget ($20.50 of $20.00 spent); "
        "it resets on 1 April at 00:00 UTC.")
    assert budgets.refusal_text(status("conversation:http|c|root", "hour", tokens=100_000,
                                       spent_tokens=120_000)) == (
        "This conversation has reached its hourly budget (120,000 of 100,000 tokens used); "
        "it resets at 15:00 UTC.")
    assert budgets.refusal_text(status("total", "day", usd=0.5, spent_usd=0.5)) == (
        "All agents together have reached their daily budget ($0.50 of $0.50 spent); "
        "it resets at 00:00 UTC.")


def test_the_warning_at_80_percent_and_past_the_limit() -> None:
    assert budgets.warning_text(status("agent:ops", "day", usd=5, spent_usd=4.15)) == (
        "Heads up: this agent has used 83% of its daily budget ($4.15 of $5.00). Once it is "
        "reached, new requests are refused until it resets at 00:00 UTC.")
    assert budgets.warning_text(status("user:slack:U1", "day", usd=5, spent_usd=6)) == (
        "Heads up: you have used all of your daily budget ($6.00 of $5.00); new requests are "
        "refused until it resets at 00:00 UTC.")


def test_usd_amounts_read_as_money() -> None:
    assert [budgets.format_usd(m) for m in (0, 5_000_000, 420_000, 4_200, 15_000, 1_234_567_890)] \
        == ["$0.00", "$5.00", "$0.42", "$0.0042", "$0.015", "$1,234.57"]


def test_statuses_and_the_blocking_budget(r: redis.Redis) -> None:
    t = (SOON + timedelta(hours=14, minutes=20)).timestamp()
    budgets.put(r, Budget(scope="agent:ops", period="day", usd_micros=2_000_000))
    budgets.put(r, Budget(scope="agent:ops", period="month", usd_micros=3_000_000))
    budgets.put(r, Budget(scope="user:http:c", period="hour", tokens=1000))
    budgets.put(r, Budget(scope="agent:other", period="day", usd_micros=1))
    assert budgets.blocking(budgets.statuses(r, SCOPES, t)) is None
    store.record(r, SCOPES, 1000, 500, 3_500_000, "", t)
    found = budgets.statuses(r, SCOPES, t)
    assert [(s.budget.scope, s.budget.period, round(s.share, 3)) for s in found] == [
        ("agent:ops", "day", 1.75), ("agent:ops", "month", 1.167), ("user:http:c", "hour", 1.5)]
    # All three are reached: the month's is the one that holds a turn back longest.
    block = budgets.blocking(found)
    assert block is not None and block.budget.period == "month"
    assert budgets.remove(r, "agent:ops", "month") and not budgets.remove(r, "agent:ops", "month")
    block = budgets.blocking(budgets.statuses(r, SCOPES, t))
    assert block is not None and block.budget.period == "day"
    with pytest.raises(ValueError):
        Budget(scope="total", period="day")


def test_a_budget_warns_once_per_scope_and_period(r: redis.Redis) -> None:
    day = SOON + timedelta(hours=14)
    s = status("agent:ops", "day", usd=5, spent_usd=4.2, when=day)
    assert budgets.mark_warned(r, s)
    assert not budgets.mark_warned(r, s)
    assert not budgets.mark_warned(r, status("agent:ops", "day", usd=5, spent_usd=4.9, when=day))
    assert budgets.mark_warned(r, status("agent:ops", "month", usd=5, spent_usd=4.2, when=day))
    # A new limit warns again; so does the next day.
    assert budgets.mark_warned(r, status("agent:ops", "day", usd=6, spent_usd=5, when=day))
    assert budgets.mark_warned(r, status("agent:ops", "day", usd=5, spent_usd=4.2,
                                         when=day + timedelta(hours=10)))
    key = keys.budget_warned("day", bucket_id("day", day))
    assert expires(r, key) == int((SOON + timedelta(days=2)).timestamp())
