"""Strangers cannot flush the audit trail (issue 25, item 13).

Each dropped stranger message appended an entry, and retention is by count (100,000), so a
flood of strangers pushed real history out. Now refusals are counted per sender and hour (an
entry at the 1st, 10th, 100th, ... refusal, and past 50 senders one shared count), and
retention by count does not count them: only age removes them, with what is older than the
real history kept.

The real app in-process and the real scripts on a real Redis.
"""

from __future__ import annotations

import asyncio
import types

import pytest
import redis
import redis.asyncio as aioredis

from fermix_shared import audit, keys
from fermix_shared.audit import refusals
from fermix_shared.audit.model import AuditConfig
from fermix_shared.audit.store import AuditLog
from tests.gateway.inprocess import gateway, telegram_headers, tg_update

NOW = 1_800_000_000.0  # the refusals' clock: one hour window for the whole test
WINDOW = int(NOW) // 3600 * 3600


def entries_of(r: redis.Redis, actor: str) -> list[audit.AuditEntry]:
    return [e for e in AuditLog(r).recent(limit=10_000) if e.actor == actor][::-1]


def test_a_stranger_flooding_a_chat_leaves_three_entries_not_120(
    r: redis.Redis, scratch_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(refusals, "time", types.SimpleNamespace(time=lambda: NOW))
    with gateway(scratch_redis_url) as (client, _):
        for i in range(120):
            resp = client.post("/webhooks/telegram", headers=telegram_headers(),
                               json=tg_update(7000 + i, f"spam {i}", chat=999, user=999))
            assert resp.status_code == 200
    got = entries_of(r, "telegram:999")
    assert [(e.kind, e.action, e.outcome) for e in got] == [("trust", "inbound", "fail")] * 3
    assert [e.detail["count"] for e in got] == [1, 10, 100]
    assert all(e.detail["refusal"] is True and e.detail["window"] == WINDOW * 1000
               and e.detail["trust"] == "stranger" for e in got)
    assert r.hget(keys.audit_refusals(WINDOW), "telegram:999") == "120"
    assert r.llen(keys.inbox("telegram|999|root")) == 0


def test_past_fifty_strangers_an_hour_they_share_one_count(scratch_redis_url: str,
                                                           r: redis.Redis) -> None:
    async def flood() -> None:
        client = aioredis.Redis.from_url(scratch_redis_url, decode_responses=True)
        try:
            for i in range(80):
                await audit.arecord_refusal(client, "trust", "inbound",
                                            actor=f"slack:U{i:04d}", now=NOW)
        finally:
            await client.aclose()

    asyncio.run(flood())
    kept = AuditLog(r).recent(limit=1000)
    own = [e for e in kept if e.actor != refusals.OTHERS]
    assert len(own) == refusals.MAX_SENDERS == 50
    assert [e.detail["count"] for e in kept if e.actor == refusals.OTHERS] == [10, 1]
    assert r.hget(keys.audit_refusals(WINDOW), "#others") == "30"
    assert r.hlen(keys.audit_refusals(WINDOW)) == 50 + 2  # the senders, #senders, #others


def real(r: redis.Redis, n: int, tag: str) -> None:
    for i in range(n):
        audit.record(r, "admin", f"{tag}-{i}", "ok", actor="cli")


def test_retention_by_count_never_drops_real_history_for_refusals(r: redis.Redis) -> None:
    real(r, 10, "early")
    for i in range(300):  # as many refusal entries as 300 strangers' first messages make
        audit.record(r, "trust", "inbound", "fail", actor=f"telegram:{i}", refusal=True,
                     count=1)
    real(r, 5, "late")
    log = AuditLog(r)
    assert log.trim(AuditConfig(max_entries=10, max_age_days=0)) == 5
    kept = log.recent(limit=1000)
    assert [e.action for e in kept if not e.detail.get("refusal")] == \
        [f"late-{i}" for i in range(4, -1, -1)] + [f"early-{i}" for i in range(9, 4, -1)]
    assert len([e for e in kept if e.detail.get("refusal")]) == 300
    assert log.verify().ok
    # As real history comes, its oldest entries go, and the refusals among them with them.
    real(r, 6, "later")
    assert log.trim(AuditConfig(max_entries=10, max_age_days=0)) == 5 + 300 + 1
    kept = log.recent(limit=1000)
    assert [e.action for e in kept][::-1] == [f"late-{i}" for i in range(1, 5)] + \
        [f"later-{i}" for i in range(6)]
    assert log.trim(AuditConfig(max_entries=10, max_age_days=0)) == 0
    assert log.verify().ok


def test_refusals_go_by_age(r: redis.Redis) -> None:
    for i in range(20):
        audit.record(r, "trust", "inbound", "fail", actor=f"telegram:{i}", refusal=True, count=1)
    real(r, 2, "kept")
    log = AuditLog(r)
    stamps = [e.ts for e in log.recent(limit=100)]
    # 20 refusals and a cap of 10: none goes before it is a day old.
    assert log.trim(AuditConfig(max_entries=10, max_age_days=1),
                    now_ms=min(stamps) + 86_400_000) == 0
    assert log.trim(AuditConfig(max_entries=10, max_age_days=1),
                    now_ms=max(stamps) + 86_400_001) == 22
    assert log.verify().ok
