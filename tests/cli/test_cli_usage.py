"""``fermix usage`` and ``fermix budget set|list|rm``: the CLI (in this process) against the real
gateway app (uvicorn in a thread, scratch Redis holding recorded usage)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import uvicorn

from fermix_cli.main import main
from fermix_dev.procs import free_port, wait_until
from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings, get_settings
from fermix_shared.usage import store
from fermix_shared.usage.periods import bucket_id, next_start, recent
from tests.cli.terminal import ANSI

TOKEN = "cli-t0k"


@pytest.fixture(scope="module")
def url(scratch_redis_url: str) -> Iterator[str]:
    base = scratch_redis_url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(base).flushdb()
    app = create_app(Settings(redis_url=base, api_token=TOKEN), hooks=HookRegistry())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "in-process gateway")
    r = redis.Redis.from_url(base, decode_responses=True)
    now = time.time()
    # A turn's call and a memory review's, each also counted in its kind's tally.
    store.record(r, ["total", "agent:ops", "conversation:telegram|42|root", "user:telegram:7",
                     "kind:turn"],
                 1000, 500, 2_000_000, "", now, cache_read=600, cache_write=100, reasoning=50)
    store.record(r, ["total", "agent:default", "kind:memory_review"], 10, 0, 0, "local-llama",
                 now)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def fermix(url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("FERMIX_GATEWAY_URL", url)
    monkeypatch.setenv("FERMIX_API_TOKEN", TOKEN)
    get_settings.cache_clear()
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr()
    return code, out.out, out.err


def test_usage_and_budgets_from_the_command_line(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: str) -> tuple[int, str, str]:
        return fermix(url, monkeypatch, capsys, *args)

    now = time.time()
    code, out, _ = run("budget", "set", "--scope", "agent:ops", "--period", "day", "--usd", "5")
    resets = next_start("day", now).strftime("%Y-%m-%d %H:%M UTC")
    assert (code, out) == (0, f"Budget set: agent:ops daily: $2.00 of $5.00 (40%), "
                              f"resets {resets}.\n")
    assert run("budget", "list") == (0, f"agent:ops daily: $2.00 of $5.00 (40%), resets {resets}\n", "")

    code, out, _ = run("usage")
    day, month = bucket_id("day", now), bucket_id("month", now)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "total"
    # A spending with calls of a model without a price says it is more than its sum, and the
    # model is named; the cache's and the reasoning's tokens are shown apart.
    parts = "[600 cache read, 100 cache write, 50 reasoning]"
    total = f"$2.00 + unknown (1,510 tokens, 2 calls, 1 of an unknown model) {parts}"
    assert lines[2] == f"  today       {day:<14} {total}"
    assert lines[3] == f"  this month  {month:<14} {total}"
    assert lines[4:] == [
        f"agents today ({day}):",
        f"  ops              $2.00 (1,500 tokens, 1 call) {parts}",
        "  default          $0.00 + unknown (10 tokens, 1 call, 1 of an unknown model)",
        "priced at $0: unknown model local-llama (1 call); set [prices.\"MODEL\"] "
        "input/output to price them",
    ]

    code, out, _ = run("usage", "--agent", "ops", "--by", "day", "--last", "2")
    days = [bucket_id("day", s) for s in recent("day", now, 2)]
    assert (code, out.splitlines()[:3]) == (0, [
        "agent:ops", f"  {days[0]:<14} $2.00 (1,500 tokens, 1 call) {parts}",
        f"  {days[1]:<14} $0.00 (0 tokens, 0 calls)"])
    code, out, _ = run("usage", "--conversation", "telegram:42", "--json")
    body = json.loads(out)
    assert body["scope"] == "conversation:telegram|42|root"
    assert body["periods"]["day"]["usdMicros"] == 2_000_000

    # The fleet's spending by what made the calls; kinds without calls are left out.
    code, out, _ = run("usage", "--by", "kind")
    hour = bucket_id("hour", now)
    kinds = [f"    turn           $2.00 (1,500 tokens, 1 call) {parts}",
             "    memory_review  $0.00 + unknown (10 tokens, 1 call, 1 of an unknown model)"]
    assert (code, out.splitlines()) == (0, [
        "total by kind", f"  this hour ({hour})", *kinds, f"  today ({day})", *kinds,
        f"  this month ({month})", *kinds])
    code, _, err = run("usage", "--by", "kind", "--agent", "ops")
    assert (code, err) == (2, "fermix: --by kind is the whole fleet's (no --agent, "
                              "--conversation, --user or --last)\n")

    assert run("budget", "rm", "--scope", "agent:ops", "--period", "day") == (
        0, "Removed the daily budget on agent:ops.\n", "")
    code, _, err = run("budget", "rm", "--scope", "agent:ops", "--period", "day")
    assert (code, err) == (1, "fermix: no daily budget on agent:ops\n")
    code, _, err = run("usage", "--user", "nobody")
    assert code == 2 and "a user is CHANNEL:ID" in err
    code, _, err = run("budget", "set", "--scope", "total", "--period", "day")
    assert (code, err) == (2, "fermix: a budget needs --usd, --tokens or both\n")


def test_budget_set_and_rm_print_what_changed_as_json(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = fermix(url, monkeypatch, capsys, "budget", "set", "--scope", "total",
                          "--period", "month", "--tokens", "9", "--json")
    assert code == 0 and json.loads(out)["limit"] == {"usd": None, "tokens": 9}
    code, out, _ = fermix(url, monkeypatch, capsys, "budget", "rm", "--scope", "total",
                          "--period", "month", "--json")
    assert (code, json.loads(out)) == (0, {"removed": {"scope": "total", "period": "month"}})


def test_usage_is_tables_on_a_terminal(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A person reading: a table per scope, the agents' spending today, the split by kind;
    the parts of the tokens get columns only where there are some."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # stdout is a terminal to rich
    monkeypatch.setenv("COLUMNS", "160")
    day = bucket_id("day", time.time())

    def rows(*args: str) -> list[list[str]]:
        code, out, _ = fermix(url, monkeypatch, capsys, *args)
        assert code == 0 and "\x1b[" in out
        return [line.split() for line in ANSI.sub("", out).splitlines()]

    shown = rows("usage")
    assert ["PERIOD", "BUCKET", "COST", "TOKENS", "CALLS", "CACHE", "READ", "CACHE", "WRITE",
            "REASONING"] in shown
    assert ["today", day, "$2.00", "+", "unknown", "1,510", "2", "600", "100", "50"] in shown
    assert ["agents", "today", f"({day})"] in shown
    assert ["ops", "$2.00", "1,500", "1", "600", "100", "50"] in shown
    assert ["default", "$0.00", "+", "unknown", "10", "1", "0", "0", "0"] in shown
    assert shown[-1][:3] == ["priced", "at", "$0:"]
    assert ["today", f"({day})", "memory_review", "$0.00", "+", "unknown", "10", "1", "0", "0",
            "0"] in rows("usage", "--by", "kind")
    # No cache, no reasoning: no columns for them.
    assert ["PERIOD", "BUCKET", "COST", "TOKENS", "CALLS"] in rows("usage", "--agent", "default")
