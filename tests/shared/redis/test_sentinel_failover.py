"""The standard Sentinel set-up loses its primary (issue 25 item 4): one primary, one replica,
three sentinels (all redis-server), a gateway in this process.

``FERMIX_REDIS_WAIT_REPLICAS`` unset (``auto``): after the promotion the new master has no
replica, and the gateway accepts again, without a WAIT, counting each such accept
(``fermix_unreplicated_accepts_total``), warning once, and saying so in ``/healthz`` and
``fermix doctor`` (``redis.replicas``). ``=1`` (strict): every message is refused 503 after the
loss, as documented (a loss is survived only with N + 1 replicas).
"""

from __future__ import annotations

import logging
import re
import time

import pytest
from fastapi.testclient import TestClient

from fermix_cli.doctor.sentinel_checks import (
    SentinelFacts,
    check_replicas,
    check_sentinels,
    replica_checks,
    sentinel_checks,
)
from fermix_dev.procs import wait_until
from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.redis.replicas import AUTO, WaitRule, wait_rule
from fermix_shared.settings import Settings
from tests.gateway.inprocess import RecordingCelery
from tests.sentinels import SentinelSet
from tests.shared.redis.test_sentinel import TOKEN, sentinel_settings

WARNING = "the Redis primary has no connected replica"


def test_the_doctor_lines_under_auto_and_strict() -> None:
    assert check_replicas(1, AUTO).level == "ok"
    assert check_replicas(0, AUTO).level == "warn"
    assert check_replicas(1, WaitRule(2, strict=True)).level == "fail"
    assert check_replicas(None, AUTO).level == "fail"
    one = check_sentinels(SentinelFacts(3, 3, 3, "10.0.0.1:6379", 1, 2), "m", 1, strict=False)
    assert one.level == "warn" and "accepted unreplicated (auto)" in one.message
    assert check_sentinels(SentinelFacts(3, 3, 3, "10.0.0.1:6379", 2, 2), "m", 1,
                           strict=False).level == "ok"


def _post(client: TestClient, text: str) -> tuple[int, dict[str, object]]:
    resp = client.post("/v1/agent", json={"message": text, "chatId": "failover-chat"},
                       headers={"Authorization": f"Bearer {TOKEN}"})
    return resp.status_code, resp.json()


def _unreplicated(client: TestClient) -> float:
    text = client.get("/metrics").text
    found = re.search(r"^fermix_unreplicated_accepts_total (\S+)$", text, re.M)
    assert found, "fermix_unreplicated_accepts_total is not exported"
    return float(found.group(1))


def _waits(sset: SentinelSet) -> int:
    c = sset.client()
    try:
        return int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    finally:
        c.close()


def _lose_primary(sset: SentinelSet) -> float:
    """SIGKILL the primary; returns when the replica was promoted (monotonic)."""
    old = sset.kill_primary()
    return sset.wait_promoted(old)


def _app(settings: Settings) -> TestClient:
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    return TestClient(app, raise_server_exceptions=False)


def test_auto_keeps_accepting_after_the_only_replica_is_promoted(
    sset: SentinelSet, caplog: pytest.LogCaptureFixture,
) -> None:
    settings = sentinel_settings(sset, db=1, api_token=TOKEN)
    assert wait_rule(settings).label == "auto"
    caplog.set_level(logging.INFO, logger="fermix_shared.redis.replicas")
    with _app(settings) as client:
        assert _post(client, "before")[0] == 202
        health = client.get("/healthz").json()
        assert health["detail"]["redis.replicas"] == {
            "level": "ok", "wait": "auto", "connected": 1, "unreplicated": 0}
        [line] = replica_checks(settings)
        assert (line.name, line.level) == ("redis.replicas", "ok")
        before = _unreplicated(client)

        promoted = _lose_primary(sset)
        waits = _waits(sset)  # the new master's
        statuses: list[int] = []
        while not statuses or statuses[-1] != 202:  # the gateway reconnects, then accepts
            statuses.append(_post(client, f"after {len(statuses)}")[0])
            assert time.monotonic() - promoted < 5, statuses
        for i in range(3):
            assert _post(client, f"and again {i}")[0] == 202
        # No WAIT was sent to a master known to have no replica (each would cost 500 ms).
        assert _waits(sset) == waits
        assert _unreplicated(client) - before == 4
        health = client.get("/healthz").json()
        assert health["status"] == "ok"
        assert health["detail"]["redis.replicas"] == {
            "level": "warn", "wait": "auto", "connected": 0, "unreplicated": 4}
    warnings = [r for r in caplog.records if WARNING in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING  # once, not per message
    [line] = replica_checks(settings)
    assert (line.name, line.level) == ("redis.replicas", "warn")
    assert "0 connected replica(s): messages are accepted unreplicated" in line.message
    # Sentinels reconnect to the new master for a moment after the promotion (the doctor then
    # says "wait for the failover to finish"); then the line says what is left.
    wait_until(lambda: sentinel_checks(settings)[0].level != "fail", 10, "sentinels settled")
    [sentinel_line] = sentinel_checks(settings)
    assert sentinel_line.level == "warn" and "accepted unreplicated" in sentinel_line.message, sentinel_line


def test_strict_one_replica_refuses_every_message_after_the_loss(sset: SentinelSet) -> None:
    settings = sentinel_settings(sset, db=2, api_token=TOKEN, redis_wait_replicas=1,
                                 redis_wait_timeout_ms=100)
    with _app(settings) as client:
        assert _post(client, "before")[0] == 202
        promoted = _lose_primary(sset)
        seen: list[int] = []
        while time.monotonic() - promoted < 3:
            status, body = _post(client, f"after {len(seen)}")
            seen.append(status)
            assert status == 503, (status, body)
        assert body == {"error": "storage not replicated, try again"}
        assert client.get("/healthz").json()["detail"]["redis.replicas"]["level"] == "fail"
    [line] = replica_checks(settings)
    assert line.level == "fail" and "answers every message 503" in line.message
