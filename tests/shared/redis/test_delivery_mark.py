"""The delivering mark names the primary it was written on (fermix_shared/redis/durability.py
DeliveryWait): a recovered turn resends unless the primary changed since (issue 25 item 5)."""

from __future__ import annotations

import redis

from fermix_shared.redis.durability import DeliveryWait
from fermix_shared.redis.replicas import AUTO, NO_WAIT, WaitRule


def test_under_a_rule_the_mark_is_the_primarys_replication_id(r: redis.Redis) -> None:
    replid = r.info("replication")["master_replid"]
    for rule in (AUTO, WaitRule(1, strict=True)):
        wait = DeliveryWait(r, rule, 500)
        with wait.pinned() as conn:
            assert wait.mark(conn) == replid
        assert not wait.failed_over_since(replid), "same primary: resend what was not sent"
        assert wait.failed_over_since("0" * 40), "another primary: never send twice"
        assert wait.failed_over_since("1"), "a mark without an id: never send twice"
        assert wait.failed_over_since("")


def test_without_a_rule_the_mark_is_1_and_a_recovery_always_resends(r: redis.Redis) -> None:
    wait = DeliveryWait(r, NO_WAIT, 500)
    with wait.pinned() as conn:
        assert wait.mark(conn) == "1"
    assert not wait.failed_over_since("1")
    assert not wait.failed_over_since("0" * 40)
