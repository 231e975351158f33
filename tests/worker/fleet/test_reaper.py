"""The reaper on a real Redis: a worker process that stopped beating loses its turns at once
(not when their leases lapse), a slow one and a parked turn keep theirs, a process that could
not reach Redis itself declares nobody dead, and lapsed turns are recovered in-process."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from fermix_shared import keys, lua
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import queue
from fermix_shared.stores.lease import TurnLease, now_ms
from fermix_worker.fleet.heartbeat import Heartbeat, Liveness
from fermix_worker.fleet.reaper import (
    ReaperConfig,
    Recoveries,
    reap,
)

LEASE_S = 30.0
CONFIG = ReaperConfig(Liveness(heartbeat_s=0.05, dead_s=5.0), stale_s=LEASE_S,
                      stale_every_s=10.0)


def server_ms(r: redis.Redis) -> int:
    secs, micros = r.time()
    return int(secs) * 1000 + int(micros) // 1000


def beat(r: redis.Redis, worker: str, seconds_ago: float) -> None:
    r.hset(keys.worker_beats(), worker, server_ms(r) - int(seconds_ago * 1000))


def busy_conversation(r: redis.Redis, worker: str) -> str:
    """A conversation whose turn ``worker`` claimed with the default 30 s lease."""
    key = ConversationKey(channel="http", chat_id=uuid.uuid4().hex[:8])
    msg = InboundMessage(run_id=f"run_{uuid.uuid4().hex}", key=key, text="hi", sender_id="u")
    queue.accept(r, msg)
    claim, lease = queue.claim(r, key.as_str(), worker, LEASE_S)
    assert claim.kind == "claimed" and lease is not None
    return key.as_str()


class Calls:
    """Records what the reaper asked for."""

    def __init__(self) -> None:
        self.recovered: list[str] = []
        self.kicked: list[str] = []
        self.republished: list[str] = []

    def scan(self, r: redis.Redis, *, may_declare_dead: bool = True) -> None:
        r.delete(keys.reaper_lock())  # each call is its own interval
        reap(r, CONFIG, recover=self.recovered.append, kick=self.kicked.append,
             republish=self.republished.append, may_declare_dead=may_declare_dead)


def lease_left_s(r: redis.Redis, conv: str) -> float:
    return (int(r.hget(keys.active(conv), "lease_until") or 0) - now_ms()) / 1000


def test_a_turn_of_a_worker_that_stopped_beating_is_recovered_now(r: redis.Redis) -> None:
    conv = busy_conversation(r, "w1@h:101")
    beat(r, "w1@h:101", seconds_ago=6)
    calls = Calls()
    calls.scan(r)
    assert calls.recovered == [conv]
    assert lease_left_s(r, conv) <= 0  # not 30 s from now
    claim, _ = queue.claim(r, conv, "w2@h:202", LEASE_S)
    assert (claim.kind, claim.attempt) == ("orphan", 2)


def test_a_slow_but_alive_worker_keeps_its_turns(r: redis.Redis) -> None:
    conv = busy_conversation(r, "w1@h:101")
    beat(r, "w1@h:101", seconds_ago=4)  # a 4 s stall is inside the 5 s margin
    calls = Calls()
    calls.scan(r)
    assert calls.recovered == []
    assert lease_left_s(r, conv) > 25
    assert queue.claim(r, conv, "w2@h:202", LEASE_S)[0].kind == "busy"


def test_a_parked_turn_waits_for_its_deadline_whoever_parked_it(r: redis.Redis) -> None:
    conv = busy_conversation(r, "w1@h:101")
    run_id = r.hget(keys.active(conv), "turn_id")
    assert TurnLease(r, conv, str(run_id), "w1@h:101", LEASE_S).park(300)
    beat(r, "w1@h:101", seconds_ago=60)  # the worker that parked it died since
    calls = Calls()
    calls.scan(r)
    assert calls.recovered == []
    assert lease_left_s(r, conv) > 250


def test_a_worker_without_a_heartbeat_is_not_taken_for_dead(r: redis.Redis) -> None:
    conv = busy_conversation(r, "solo-process")
    calls = Calls()
    calls.scan(r)
    assert calls.recovered == [] and lease_left_s(r, conv) > 25


def test_a_worker_cut_off_from_redis_declares_nobody_dead(r: redis.Redis) -> None:
    # After a Redis outage every beat is old: only a scanner whose own beats went through for
    # the whole threshold may judge the others.
    conv = busy_conversation(r, "w1@h:101")
    beat(r, "w1@h:101", seconds_ago=8)
    calls = Calls()
    calls.scan(r, may_declare_dead=False)
    assert calls.recovered == [] and lease_left_s(r, conv) > 25
    calls.scan(r)
    assert calls.recovered == [conv]


def test_the_heartbeat_counts_how_long_it_has_beaten_without_a_gap(r: redis.Redis) -> None:
    hb = Heartbeat(r, "w1@h:101", "w1@h", interval_s=0.05)
    assert hb.healthy_for() == 0
    hb.beat()
    time.sleep(0.04)
    hb.beat()
    assert 0.03 < hb.healthy_for() < 1
    assert abs(int(r.hget(keys.worker_beats(), "w1@h:101") or 0) - server_ms(r)) < 1000
    assert float(r.hget(keys.workers(), "w1@h") or 0) == pytest.approx(time.time(), abs=2)
    time.sleep(0.2)  # a missed beat (a Redis blip, a stall): the count starts again
    assert hb.healthy_for() == 0
    hb.beat()
    assert hb.healthy_for() < 0.05
    hb.mark_stopped()  # a clean stop: whatever it still held is recovered at once
    assert r.hget(keys.worker_beats(), "w1@h:101") == "0" and not r.hexists(keys.workers(), "w1@h")


def test_the_lease_ends_only_while_the_silent_worker_still_holds_the_turn(r: redis.Redis) -> None:
    conv = busy_conversation(r, "w1@h:101")
    beat(r, "w1@h:101", seconds_ago=6)
    args: dict[str, lua.Arg] = dict(
        active=keys.active(conv), active_index=keys.active_index(), beats=keys.worker_beats(),
        dead_ms=5000, now_ms=now_ms(), conv=conv)
    assert lua.EXPIRE_DEAD(r, worker="w9@h:909", **args) == 0  # someone else holds it now
    beat(r, "w1@h:101", seconds_ago=1)  # it beat again in between
    assert lua.EXPIRE_DEAD(r, worker="w1@h:101", **args) == 0
    beat(r, "w1@h:101", seconds_ago=6)
    assert lua.EXPIRE_DEAD(r, worker="w1@h:101", **args) == 1


def test_a_dead_worker_is_forgotten_once_it_holds_nothing(r: redis.Redis) -> None:
    conv = busy_conversation(r, "w1@h:101")
    beat(r, "w1@h:101", seconds_ago=6)
    beat(r, "w2@h:202", seconds_ago=0)
    calls = Calls()
    calls.scan(r)
    assert r.hexists(keys.worker_beats(), "w1@h:101")  # it held a turn during that scan
    queue.claim(r, conv, "w2@h:202", LEASE_S)  # the recovery took it
    calls.scan(r)
    assert r.hkeys(keys.worker_beats()) == ["w2@h:202"]


def test_lapsed_turns_are_recovered_every_scan_stale_queues_kicked_less_often(
    r: redis.Redis,
) -> None:
    lapsed = busy_conversation(r, "w1@h:101")
    r.hset(keys.active(lapsed), "lease_until", now_ms() - 1)
    r.zadd(keys.active_index(), {lapsed: now_ms() - 1})
    stale = "http|waiting|root"
    r.zadd(keys.queued_index(), {stale: now_ms() - int(LEASE_S * 1000) - 1})
    calls = Calls()
    calls.scan(r)
    calls.scan(r)
    assert calls.recovered == [lapsed, lapsed]
    assert calls.kicked == [stale]  # once per stale interval (10 s here)


def test_a_conversation_left_in_the_active_index_is_recovered_once(r: redis.Redis) -> None:
    conv = "http|ghost|root"  # no active turn, nothing waiting, yet indexed as active
    r.zadd(keys.active_index(), {conv: now_ms() - 1})
    calls = Calls()
    calls.scan(r)
    assert calls.recovered == [conv]
    assert queue.claim(r, conv, "w2@h:202", LEASE_S)[0].kind == "empty"
    calls.scan(r)
    assert calls.recovered == [conv] and r.zscore(keys.active_index(), conv) is None


def test_recoveries_run_beside_the_pool_once_per_conversation_then_kick(r: redis.Redis) -> None:
    release = threading.Event()
    ran: list[str] = []
    kicked: list[str] = []

    def dispatch(conv: str) -> None:
        ran.append(conv)
        release.wait(5)

    rec = Recoveries(dispatch, kicked.append, limit=2)
    rec("a")
    rec("a")  # already being recovered here
    rec("b")
    rec("c")  # past the limit: a Celery dispatch instead
    time.sleep(0.1)
    assert sorted(ran) == ["a", "b"] and kicked == ["c"] and rec.running() == 2
    assert not rec.drain(0.05)
    release.set()
    assert rec.drain(5) and rec.running() == 0


def test_the_defaults_notice_a_dead_worker_within_seconds() -> None:
    config = ReaperConfig.from_settings(Settings())
    assert config.liveness == Liveness(heartbeat_s=1.0, dead_s=5.0)
    assert config.stale_every_s == 10.0
    # The threshold never falls under three beats, whatever is configured.
    assert Liveness.from_settings(Settings(worker_heartbeat_seconds=3,
                                           worker_dead_seconds=2)).dead_s == 9
