"""``GET /v1/fleet`` on the gateway in this process (TestClient) over a private Redis: worker
processes with their heartbeat, slots and turns in flight, this gateway's own heartbeat, the
beat leader's lock, Redis, and turns a minute by outcome."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_dev.procs import wait_until
from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.settings import Settings
from fermix_shared.stores import fleet

TOKEN = "fleet-t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/9"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.close()


def test_the_fleet_shows_its_workers_gateways_beat_redis_and_turns(
    db: tuple[str, redis.Redis]
) -> None:
    r, now = db[1], time.time()
    r.hset(keys.worker_beats(), mapping={"host-a:11:x": int(now * 1000) - 1_500,
                                         "host-b:12:y": 0})
    fleet.publish_slots(r, "host-a:11:x", 100)
    r.hset(keys.active("http|c|root"), mapping={"turn_id": "run_1", "worker": "host-a:11:x"})
    r.zadd(keys.active_index(), {"http|c|root": int(now * 1000) + 30_000})
    r.set(keys.beat_lock(), "token", px=8_000)
    for status in ("ok", "ok", "error"):
        fleet.count_turn(r, status, now)
    with TestClient(create_app(Settings(redis_url=db[0], api_token=TOKEN))) as client:
        wait_until(lambda: r.hlen(keys.gateways()) == 1, 10, "this gateway's heartbeat")
        body = client.get("/v1/fleet", headers=AUTH).json()
    a, b = body["workers"]
    assert (a["process"], a["node"], a["slots"], a["turnsInFlight"], a["stopped"]) == (
        "host-a:11:x", "host-a", 100, 1, False)
    assert 1_400 <= a["heartbeatAgoMs"] <= 1_500 + (time.time() - now) * 1000 + 100
    assert (b["stopped"], b["heartbeatAgoMs"], b["slots"]) == (True, None, None)
    (gw,) = body["gateways"]
    assert gw["seenAgoMs"] < 10_000
    assert body["beat"]["leader"] and 0 < body["beat"]["lockExpiresInMs"] <= 8_000
    assert body["redis"]["role"] == "master" and body["redis"]["sentinel"] is None
    assert len(body["turnsPerMinute"]) == fleet.MINUTES_SHOWN
    last = body["turnsPerMinute"][-1]
    assert (last["ok"], last["error"], last["stopped"]) == (2, 1, 0)
    assert body["queue"]["activeConversations"] == 1
