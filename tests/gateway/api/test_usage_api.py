"""``GET /v1/usage``, ``/v1/budgets`` and the ``/usage`` command, on the gateway in this process
(TestClient) over a private Redis holding recorded usage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway import commands
from fermix_gateway.app import create_app
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from fermix_shared.usage import store
from fermix_shared.usage.periods import bucket_id, next_start, recent, start_of

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONV = "http|c1|root"
SCOPES = ["total", "agent:default", f"conversation:{CONV}", "user:http:c1"]


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/5"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.close()


@pytest.fixture
def client(db: tuple[str, redis.Redis]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(redis_url=db[0], api_token=TOKEN))) as c:
        yield c


def get(client: TestClient, path: str, **params: Any) -> Any:
    resp = client.get(path, params=params, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_usage_of_a_scope_now_and_as_a_series(client: TestClient, db: tuple[str, redis.Redis]
                                              ) -> None:
    r, now = db[1], time.time()
    # 1000 input tokens, of which 600 read from the prompt cache and 100 written; 500 output,
    # of which 50 reasoning.
    store.record(r, SCOPES, 1000, 500, 2_000_000, "", now, cache_read=600, cache_write=100,
                 reasoning=50)
    store.record(r, ["total", "agent:ops"], 10, 0, 0, "local-llama", now)
    assert client.get("/v1/usage").status_code == 401

    body = get(client, "/v1/usage")
    assert body["scope"] == "total" and body["budgets"] == []
    # The model without a price is named, with its calls, not folded into the cost silently.
    assert body["unpricedModels"] == {"local-llama": 1}
    day = body["periods"]["day"]
    assert day == {
        "bucket": bucket_id("day", now), "start": int(start_of("day", now).timestamp() * 1000),
        "resetsAt": int(next_start("day", now).timestamp() * 1000), "inputTokens": 1010,
        "outputTokens": 500, "tokens": 1510, "calls": 2, "usd": 2.0, "usdMicros": 2_000_000,
        "unpricedCalls": 1, "cacheReadTokens": 600, "cacheWriteTokens": 100,
        "reasoningTokens": 50,
    }
    assert set(body["periods"]) == {"hour", "day", "month"}
    conv = get(client, "/v1/usage", scope="conversation:http:c1", period="month")
    assert conv["scope"] == f"conversation:{CONV}" and list(conv["periods"]) == ["month"]
    assert conv["periods"]["month"]["usdMicros"] == 2_000_000

    series = get(client, "/v1/usage", scope="agent:default", by="hour", last=3)
    assert [b["bucket"] for b in series["buckets"]] == [
        bucket_id("hour", s) for s in recent("hour", now, 3)]
    assert [b["calls"] for b in series["buckets"]] == [1, 0, 0]
    today = get(client, "/v1/usage", scope="agent:default", by="hour", period="day")
    assert len(today["buckets"]) == start_of("hour", now).hour + 1

    agents = get(client, "/v1/usage", scope="agent")
    assert [(a["scope"], a["usdMicros"], a["unpricedCalls"]) for a in agents["scopes"]] == [
        ("agent:default", 2_000_000, 0), ("agent:ops", 0, 1)]


@pytest.mark.parametrize(("params", "error"), [
    ({"scope": "agent:NOPE"}, "scope: not an agent name: 'NOPE'"),
    ({"scope": "agent", "by": "day"}, "by: a series is for one scope"),
    ({"by": "month", "period": "day"}, "by: a month is longer than the period (day)"),
    ({"by": "hour", "last": 73}, "last: at most 72 hours are kept"),
])
def test_bad_usage_queries_say_why(client: TestClient, params: dict[str, Any], error: str
                                   ) -> None:
    resp = client.get("/v1/usage", params=params, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["error"].startswith(error), resp.text


def test_budgets_are_set_listed_and_removed(client: TestClient, db: tuple[str, redis.Redis]
                                            ) -> None:
    store.record(db[1], SCOPES, 1000, 500, 4_000_000, "", time.time())
    resp = client.put("/v1/budgets", headers=AUTH,
                      json={"scope": "agent:default", "period": "day", "usd": 5})
    assert resp.status_code == 200, resp.text
    entry = resp.json()
    assert {k: entry[k] for k in ("scope", "period", "limit", "spent", "percent", "reached")} == {
        "scope": "agent:default", "period": "day", "limit": {"usd": 5.0, "tokens": None},
        "spent": {"usd": 4.0, "tokens": 1500}, "percent": 80.0, "reached": False}
    both = client.put("/v1/budgets", headers=AUTH,
                      json={"scope": "user:http:c1", "period": "hour", "usd": 1, "tokens": 1000})
    assert both.json()["reached"] is True and both.json()["percent"] == 400.0
    listed = get(client, "/v1/budgets")["budgets"]
    assert [(b["scope"], b["period"]) for b in listed] == [("agent:default", "day"),
                                                          ("user:http:c1", "hour")]
    assert get(client, "/v1/usage", scope="agent:default")["budgets"] == [listed[0]]
    for bad in ({"scope": "agent:default", "period": "day"},
                {"scope": "agent:default", "period": "day", "usd": -1},
                {"scope": "team:x", "period": "day", "usd": 1},
                {"scope": "agent:default", "period": "week", "usd": 1}):
        assert client.put("/v1/budgets", headers=AUTH, json=bad).status_code == 422, bad
    gone = client.delete("/v1/budgets", headers=AUTH,
                         params={"scope": "agent:default", "period": "day"})
    assert gone.status_code == 200
    again = client.delete("/v1/budgets", headers=AUTH,
                          params={"scope": "agent:default", "period": "day"})
    assert again.status_code == 404
    assert again.json()["error"] == "no daily budget on agent:default"


def test_usage_in_chat_is_for_the_owner(client: TestClient, db: tuple[str, redis.Redis]) -> None:
    now = time.time()
    store.record(db[1], SCOPES, 1000, 500, 2_000_000, "", now)
    store.record(db[1], ["total", "agent:default"], 100, 0, 420_000, "", now)
    client.put("/v1/budgets", headers=AUTH,
               json={"scope": "agent:default", "period": "day", "usd": 5})
    run = client.post("/v1/agent", json={"message": "/usage", "chatId": "c1"}, headers=AUTH)
    reply = client.get(f"/v1/runs/{run.json()['runId']}/wait", params={"timeout": 5},
                       headers=AUTH).json()["reply"]
    assert reply == (
        "Today (UTC): this conversation $2.00 (1,500 tokens, 1 call); "
        "agent default $2.42 (1,600 tokens, 2 calls).\n"
        "This month: this conversation $2.00 (1,500 tokens, 1 call); "
        "agent default $2.42 (1,600 tokens, 2 calls).\n"
        "Budgets:\n• agent:default daily: $2.42 of $5.00 (48%), resets at 00:00 UTC")
    guest = asyncio.run(commands.handle(
        None, Settings(), ConversationKey(channel="telegram", chat_id="1"),  # type: ignore[arg-type]
        commands.Command("usage", ""), commands.Caller("telegram:9", "guest")))
    assert guest.reply == "Sorry, /usage is only available to the owner."
