"""Redis through Sentinel (issue 19): the two settings, every client finding the master through
real sentinels (a primary, one replica and three sentinels, all redis-server), and the
durability wait at accept: with the replica stopped, an accepted message is answered 503 with
Retry-After, and the platform's retry, a duplicate, gets the normal answer.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import ValidationError

from fermix_cli.doctor.sentinel_checks import SentinelFacts, check_sentinels, sentinel_checks
from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.celery_app import make_celery, redis_conf
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.redis.broker import SENTINEL_TRANSPORT, SentinelChannel
from fermix_shared.redis.client import async_client_for_settings, client_for_settings
from fermix_shared.redis.durability import write_session
from fermix_shared.redis.replicas import wait_rule
from fermix_shared.redis.sentinel import (
    MasterConnection,
    parse_sentinels,
    sentinel_target,
)
from fermix_shared.settings import Settings
from fermix_shared.stores import queue
from tests.gateway.inprocess import RecordingCelery
from tests.sentinels import MASTER, SentinelSet

TOKEN = "sentinel-test-token"


def sentinel_settings(s: SentinelSet, db: int = 0, **kw: object) -> Settings:
    # The URL's host and port name nothing that runs: only its db counts.
    return Settings(redis_url=f"redis://127.0.0.1:1/{db}",
                    redis_sentinels=parse_sentinels(s.addresses), redis_master=MASTER,
                    **kw)  # type: ignore[arg-type]


# -- settings ------------------------------------------------------------------------------


def test_sentinel_addresses_parse_with_default_port_and_ipv6() -> None:
    assert parse_sentinels(" 10.0.0.5:26380, sentinel-b ,[::1]:5000,") == [
        ("10.0.0.5", 26380), ("sentinel-b", 26379), ("::1", 5000)]
    assert parse_sentinels(["a:1", "b:2"]) == [("a", 1), ("b", 2)]


@pytest.mark.parametrize("bad", ["a:x", "a:0", "a:70000", "::1:5000", "[::1", "a b:1", ":1"])
def test_a_bad_sentinel_entry_is_named_in_the_error(bad: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(f"FERMIX_REDIS_SENTINELS: '{bad}'")):
        Settings(redis_sentinels=f"ok:1,{bad}", redis_master="m")  # type: ignore[arg-type]


def test_sentinels_and_master_come_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERMIX_REDIS_SENTINELS", "s1:26379,s2:26379")
    with pytest.raises(ValidationError, match="FERMIX_REDIS_MASTER is not"):
        Settings()
    monkeypatch.delenv("FERMIX_REDIS_SENTINELS")
    monkeypatch.setenv("FERMIX_REDIS_MASTER", "mymaster")
    with pytest.raises(ValidationError, match="FERMIX_REDIS_SENTINELS is not"):
        Settings()
    monkeypatch.setenv("FERMIX_REDIS_SENTINELS", "s1:26379,s2:26379")
    s = Settings()
    assert (s.redis_sentinels, s.redis_master) == ([("s1", 26379), ("s2", 26379)], "mymaster")


def test_the_wait_defaults_to_one_replica_with_sentinel_and_none_without() -> None:
    assert wait_rule(Settings()).replicas == 0
    with_sentinel = Settings(redis_sentinels="s:1", redis_master="m")  # type: ignore[arg-type]
    assert wait_rule(with_sentinel).replicas == 1 and with_sentinel.redis_wait_timeout_ms == 500
    assert wait_rule(Settings(redis_sentinels="s:1", redis_master="m",  # type: ignore[arg-type]
                              redis_wait_replicas=0)).replicas == 0


def test_the_url_gives_db_and_credentials_and_celery_goes_through_sentinel() -> None:
    s = Settings(redis_url="redis://app:p%40ss@ignored:1/3",
                 redis_sentinels="h1:1,h2:2",  # type: ignore[arg-type]
                 redis_master="prod")
    target = sentinel_target(s)
    assert target is not None
    assert target.connection_kwargs() == {"db": 3, "username": "app", "password": "p@ss"}
    conf = redis_conf(s)
    assert conf["broker_url"] == "sentinel://app:p%40ss@h1:1/3;sentinel://app:p%40ss@h2:2/3"
    assert conf["broker_transport"] == SENTINEL_TRANSPORT
    assert conf["result_backend"] == conf["broker_url"]
    assert conf["result_backend_transport_options"]["master_name"] == "prod"
    assert conf["redbeat_redis_url"].startswith("redis-sentinel")
    assert conf["redbeat_redis_options"]["sentinels"] == [("h1", 1), ("h2", 2)]
    app = make_celery(s)
    assert app.conf.broker_transport_options["master_name"] == "prod"
    assert sentinel_target(Settings()) is None and redis_conf(Settings())["broker_url"].startswith(
        "redis://")


def test_the_doctor_line_says_what_a_failover_would_leave() -> None:
    def facts(replicas: int, answered: int = 3) -> SentinelFacts:
        return SentinelFacts(3, answered, answered, "10.0.0.1:6379", replicas, 2)

    assert check_sentinels(facts(2), "m", 1).level == "ok"
    one = check_sentinels(facts(1), "m", 1)
    assert one.level == "warn" and "refuses messages" in one.message
    assert check_sentinels(facts(0), "m", 1).level == "fail"
    assert check_sentinels(facts(2, answered=2), "m", 1).level == "warn"
    assert check_sentinels(SentinelFacts(3, 0, 0, None, 0, 0), "m", 1).level == "fail"


# -- real sentinels ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sset(tmp_path_factory: pytest.TempPathFactory, logs_dir: Path) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path_factory.mktemp("sentinel-set"), logs_dir, replicas=1)
    yield s
    s.stop()


def test_the_worker_and_gateway_clients_reach_the_master_through_sentinel(
    sset: SentinelSet,
) -> None:
    settings = sentinel_settings(sset, db=2)
    sync = client_for_settings(settings)
    sync.set("fermix:sentinel:sync", "1")
    direct = sset.client()
    direct.select(2)
    assert direct.get("fermix:sentinel:sync") == "1"

    async def via_gateway() -> str | None:
        ar = async_client_for_settings(settings)
        try:
            await ar.set("fermix:sentinel:async", "2")
            got = await ar.get("fermix:sentinel:sync")
            return None if got is None else str(got)
        finally:
            await ar.aclose()

    assert asyncio.run(via_gateway()) == "1"
    assert direct.get("fermix:sentinel:async") == "2"
    sync.close()
    direct.close()


def test_celery_publishes_and_redbeat_connects_through_sentinel(sset: SentinelSet) -> None:
    from redbeat.schedulers import get_redis as redbeat_redis

    settings = sentinel_settings(sset, db=3)
    app = make_celery(settings)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, SentinelChannel)
        client = channel._create_client()
        assert channel._create_client() is client  # one client, cached
        assert client.connection_pool.connection_class is MasterConnection
    app.send_task("fermix.test.ping", args=["hi"], queue="fermix.test.sentinel")
    direct = sset.client()
    direct.select(3)
    assert direct.llen("fermix.test.sentinel") == 1
    assert redbeat_redis(app).ping()
    direct.close()


def test_the_doctor_sees_the_master_its_replica_and_three_sentinels(sset: SentinelSet) -> None:
    [line] = sentinel_checks(sentinel_settings(sset))
    assert line.name == "redis.sentinel"
    assert f"at 127.0.0.1:{sset.primary_port}, 1 replica(s) up; 3 of 3 sentinels" in line.message
    assert line.level == "warn"  # one replica: a failover would leave accepts unreplicated


def _accept(client: TestClient, text: str, message_id: str) -> tuple[int, dict[str, str], dict[str, object]]:
    resp = client.post("/v1/agent", json={"message": text, "chatId": "sentinel-chat",
                                          "messageId": message_id},
                       headers={"Authorization": f"Bearer {TOKEN}"})
    return resp.status_code, dict(resp.headers), resp.json()


def test_an_accept_no_replica_acknowledged_is_503_and_its_retry_gets_the_normal_answer(
    sset: SentinelSet,
) -> None:
    settings = sentinel_settings(sset, db=4, api_token=TOKEN, redis_wait_timeout_ms=200)
    direct = sset.client()
    direct.select(4)
    direct.flushdb()
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as client:
        status, _, body = _accept(client, "replicated", "m-1")
        assert status == 202 and body["duplicate"] is False

        [replica] = sset.replica_ports()
        sset.pause(replica)
        try:
            began = time.monotonic()
            status, headers, body = _accept(client, "on the primary only", "m-2")
            took = time.monotonic() - began
        finally:
            sset.resume(replica)
        assert status == 503 and headers["retry-after"] == "1", (status, body)
        assert 0.2 <= took < 1.5
        inbox = direct.lrange(keys.inbox("http|sentinel-chat|root"), 0, -1)
        assert any("on the primary only" in m for m in inbox)

        status, _, body = _accept(client, "on the primary only", "m-2")  # the retry
        assert status == 202 and body["duplicate"] is True
    assert len(direct.lrange(keys.inbox("http|sentinel-chat|root"), 0, -1)) == 2
    direct.close()


def test_a_duplicate_accept_still_writes_so_its_wait_covers_the_first(
    sset: SentinelSet,
) -> None:
    """A retry after a 503 is a duplicate, run on whatever pooled connection: Redis 7 counts
    only the waiting connection's own writes, so the duplicate path writes (the mark's TTL set
    again) and its WAIT then covers the first accept's replication."""
    r = sset.client()
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id="dup-chat"), text="hi")
    assert queue.accept(r, msg, message_id="dup-1").new
    offset = int(r.info("replication")["master_repl_offset"])
    again = queue.accept(r, msg.model_copy(update={"run_id": "other"}), message_id="dup-1")
    assert again.code is queue.AcceptCode.duplicate
    assert int(r.info("replication")["master_repl_offset"]) > offset
    r.close()


def test_without_a_wait_no_wait_is_sent(sset: SentinelSet) -> None:
    settings = sentinel_settings(sset, db=5, api_token=TOKEN, redis_wait_replicas=0)
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    direct = sset.client()
    before = int(direct.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    [replica] = sset.replica_ports()
    with TestClient(app, raise_server_exceptions=False) as client:
        sset.pause(replica)
        try:
            status, _, _ = _accept(client, "no wait", "w-1")
        finally:
            sset.resume(replica)
    assert status == 202
    assert int(direct.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)) == before
    direct.close()


def test_both_clients_reconnect_to_the_promoted_replica_when_the_primary_dies(
    sset: SentinelSet,
) -> None:
    """Last in this module: it kills the set's primary. The worker client's command in flight
    rides through (its connection reconnects through the sentinels, not to the dead address),
    the gateway client fails fast until the promotion, then answers."""
    settings = sentinel_settings(sset, db=6)
    sync = client_for_settings(settings)
    ar = async_client_for_settings(settings)
    loop = asyncio.new_event_loop()
    try:
        async def set_replicated() -> int:  # WAIT on the connection that wrote
            async with write_session(ar, 1) as conn:
                await conn.set("before-async", "1")
                return int(await conn.wait(1, 2000))
        assert loop.run_until_complete(set_replicated()) == 1
        # A command in flight when the primary dies (as a turn's are): BLPOP, 2 s.
        out: list[object] = []
        blocked = threading.Thread(target=lambda: out.append(sync.blpop(["never"], timeout=2)))
        blocked.start()
        direct = sset.client()
        deadline = time.monotonic() + 5
        while int(direct.info("clients")["blocked_clients"]) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        direct.close()
        killed = time.monotonic()
        old = sset.kill_primary()
        blocked.join(30)
        took = time.monotonic() - killed
        # Retried on the promoted replica (~2 s) and blocked there its 2 s, not the 20 s of
        # retrying the dead address that redis-py 8 alone would spend before failing.
        assert out == [None] and took < 10, (out, took)
        assert sync.incr("after") == 1
        while True:  # the gateway client: errors (503s) until it reconnects, then answers
            try:
                assert loop.run_until_complete(ar.get("before-async")) == "1"
                break
            except redis.RedisError:
                assert time.monotonic() - killed < 10
        new = sset.master_port()
        assert new is not None and new != old
        print(f"\nworker client's command took {took:.2f} s across the failover")
    finally:
        loop.run_until_complete(ar.aclose())
        loop.close()
        sync.close()
