"""The process's one lease renewer, on a real Redis: many running turns renewed in one round
trip per interval, each answer (/stop, a lost lease) reaching only its own turn, deadlines on
time, and a script flush or a Redis restart riding through.

Round trips are counted where they happen: the requests the keepers' Redis connections write
(a pipeline is written once). The last test runs keepers under gevent in a child process, the
worker's default pool, where an answer interrupts a blocked greenlet.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fermix_dev.procs import start_redis
from fermix_shared import keys
from fermix_shared.errors import LeaseLost, TurnCancelled, TurnTimedOut
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.stores import queue
from fermix_shared.stores.lease import TurnLease
from fermix_worker.turn.lease import LeaseKeeper, TurnDeadline
from fermix_worker.turn.renewer import deadlines
from tests.fleet import uniq

LEASE_S = 30.0
WORKER = "w1@host"


class CountingConnection(redis.Connection):
    """Counts the requests written to Redis (one per command, one per pipeline)."""

    sent = 0
    _lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with CountingConnection._lock:
            CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counted(scratch_redis_url: str) -> Iterator[redis.Redis]:
    """The keepers' client: every request it writes is counted."""
    pool = redis.ConnectionPool.from_url(scratch_redis_url, decode_responses=True,
                                         connection_class=CountingConnection)
    yield redis.Redis(connection_pool=pool)
    pool.disconnect()


def busy(r: redis.Redis, lease_s: float = LEASE_S) -> TurnLease:
    """A conversation whose turn WORKER claimed."""
    key = ConversationKey(channel="http", chat_id=uniq("chat"))
    queue.accept(r, InboundMessage(run_id=uniq("run"), key=key, text="hi", sender_id="u"))
    claim, lease = queue.claim(r, key.as_str(), WORKER, lease_s)
    assert claim.kind == "claimed" and lease is not None
    return lease


def held_by(client: redis.Redis, lease: TurnLease) -> TurnLease:
    """The same hold, renewed through ``client``."""
    return TurnLease(client, lease.conv, lease.turn_id, lease.worker, LEASE_S)


def lease_untils(r: redis.Redis, leases: list[TurnLease]) -> list[int]:
    pipe = r.pipeline(transaction=False)
    for lease in leases:
        pipe.hget(keys.active(lease.conv), "lease_until")
    return [int(v) for v in pipe.execute()]


def until(pred: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``pred`` (another thread's doing, no event to wait on) every 2 ms; when it held."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return time.time()
        time.sleep(0.002)
    raise AssertionError(f"not within {timeout} s: {what}")


def raises(check: Callable[[], None], error: type[Exception]) -> bool:
    try:
        check()
    except error:
        return True
    return False


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def renewed_since(r: redis.Redis, leases: list[TurnLease], timeout: float) -> None:
    """Until every lease's lease_until has moved past where it is now."""
    before = lease_untils(r, leases)
    until(lambda: all(b > a for a, b in zip(before, lease_untils(r, leases), strict=True)),
          timeout, "every lease renewed")


def test_200_turns_share_one_round_trip_per_interval_and_none_after_they_end(
    r: redis.Redis, counted: redis.Redis
) -> None:
    interval = 0.05
    leases = [held_by(counted, busy(r)) for _ in range(200)]
    counted.ping()  # the connection's handshake is not a renewal
    r.config_resetstat()
    sent0, began = CountingConnection.sent, time.monotonic()
    with ExitStack() as stack:
        for lease in leases:  # turns start one after another, as in a busy worker
            stack.enter_context(LeaseKeeper(lease, interval))
            time.sleep(0.0015)
        renewed_since(r, leases, 1.0)
        renewed_since(r, leases, 1.0)
    elapsed, sent = time.monotonic() - began, CountingConnection.sent - sent0
    print(f"\n200 turns, {elapsed:.2f} s: {sent} round trips, {evalsha_calls(r)} renewals")
    # A keeper of its own per turn would make ~elapsed / interval x 200 / 2 (> 1,000). One
    # pipeline per tick, plus one late tick and a first use's script load and resend:
    assert sent <= elapsed / interval + 4
    assert evalsha_calls(r) >= 2 * 200  # every lease renewed at least twice, all batched

    ended = lease_untils(r, leases)
    sent_after = CountingConnection.sent
    time.sleep(4 * interval)  # nothing may happen: give it four ticks to
    assert CountingConnection.sent == sent_after
    assert lease_untils(r, leases) == ended


def test_a_turn_is_first_renewed_within_one_interval_of_joining(
    r: redis.Redis, counted: redis.Redis
) -> None:
    interval = 0.3
    first, joining = held_by(counted, busy(r)), held_by(counted, busy(r))
    with LeaseKeeper(first, interval):
        time.sleep(0.1)  # the renewer's ticks are now out of step with the next turn's start
        claimed = lease_untils(r, [joining])[0]
        with LeaseKeeper(joining, interval):
            started = time.time()
            renewed = until(lambda: lease_untils(r, [joining])[0] > claimed, 1.0,
                            "the joining turn's first renewal")
    assert renewed - started <= interval + 0.05


def test_stop_cancels_only_its_own_turn_within_one_interval(
    r: redis.Redis, counted: redis.Redis, scratch_redis_url: str
) -> None:
    interval = 0.1
    leases = [held_by(counted, busy(r)) for _ in range(3)]
    with ExitStack() as stack:
        keepers = [stack.enter_context(LeaseKeeper(lease, interval)) for lease in leases]

        async def stop() -> queue.StopResult:
            ar = aioredis.Redis.from_url(scratch_redis_url, decode_responses=True)
            try:
                return await queue.stop_async(ar, leases[1].conv)
            finally:
                await ar.aclose()

        stopped_at = time.time()
        assert asyncio.run(stop()).active_run == leases[1].turn_id
        seen = until(lambda: raises(keepers[1].check, TurnCancelled), 1.0, "the /stop seen")
        assert seen - stopped_at <= interval + 0.05
        assert keepers[1].cancelled == "stop"
        for keeper in (keepers[0], keepers[2]):
            keeper.check()  # the others run on
            assert keeper.cancelled == ""
        renewed_since(r, leases, 1.0)  # the stopped turn keeps its lease while it winds down


def test_a_fenced_turn_loses_only_its_own_lease_and_is_renewed_no_more(
    r: redis.Redis, counted: redis.Redis
) -> None:
    interval = 0.05
    lapsing = busy(r, lease_s=0.001)
    # Its lease lapsed: another worker's recovery takes the conversation over.
    until(lambda: queue.claim(r, lapsing.conv, "w2@host", LEASE_S)[0].kind == "orphan", 2.0,
          "the lapsed turn taken over")
    fenced, other = held_by(counted, lapsing), held_by(counted, busy(r))
    with LeaseKeeper(fenced, interval) as lost, LeaseKeeper(other, interval) as kept:
        until(lambda: raises(lost.check, LeaseLost), 1.0, "the fence seen")
        kept.check()
        r.config_resetstat()
        sent0 = CountingConnection.sent
        renewed_since(r, [other], 1.0)
        renewed_since(r, [other], 1.0)
        # One renewal per round trip: only the turn that still holds its conversation.
        assert evalsha_calls(r) == CountingConnection.sent - sent0 >= 2
    assert r.hget(keys.active(lapsing.conv), "worker") == "w2@host"


def test_a_deadline_fires_within_50ms_and_a_cancelled_one_never() -> None:
    watch = deadlines()
    now = time.time()
    fired: dict[str, float] = {}
    done = {name: threading.Event() for name in ("late", "early", "gone")}

    def firing(name: str) -> Callable[[], None]:
        def fire() -> None:
            fired[name] = time.time()
            done[name].set()
        return fire

    watch.add(now + 0.25, firing("late"))
    watch.add(now + 0.1, firing("early"))  # earlier than the one the watch sleeps for
    watch.cancel(watch.add(now + 0.15, firing("gone")))
    assert done["late"].wait(2) and done["early"].is_set()
    assert 0 <= fired["early"] - (now + 0.1) < 0.05
    assert 0 <= fired["late"] - (now + 0.25) < 0.05
    assert not done["gone"].is_set()


def test_renewals_ride_through_a_script_flush_and_a_redis_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    interval = 0.05
    proc, url = start_redis(tmp_path)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    admin = redis.Redis.from_url(url, decode_responses=True)
    # The worker's client retries for ~20 s; this one fails a batch at once, as a longer
    # outage would.
    fragile = redis.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 0))
    leases = [held_by(fragile, busy(admin)) for _ in range(5)]
    caplog.set_level(logging.WARNING, logger="fermix_worker.turn.renewer")
    try:
        with ExitStack() as stack:
            keepers = [stack.enter_context(LeaseKeeper(lease, interval)) for lease in leases]
            renewed_since(admin, leases, 1.0)
            admin.script_flush()  # what a restart or a failover does to the script cache
            renewed_since(admin, leases, 1.0)
            assert not caplog.records, "a flushed script is loaded again, not a failure"

            proc.stop()  # SIGTERM: the AOF keeps the leases
            until(lambda: any("lease renewal for 5 turns failed" in rec.getMessage()
                              for rec in caplog.records), 2.0, "the failed batch logged")
            proc, _ = start_redis(tmp_path, port=port)
            renewed_since(admin, leases, 2.0)  # the next batches load the script again
            for keeper in keepers:
                keeper.check()
    finally:
        fragile.close()
        admin.close()
        proc.stop()


def gevent_child(url: str) -> None:
    """Run in a gevent-patched child: three turns blocked in ``interruptible`` regions; the
    parent stops the first, the third has a deadline. Prints when each ended and how."""
    import gevent

    interval = 0.2
    r = redis.Redis.from_url(url, decode_responses=True)
    leases = [busy(r) for _ in range(3)]
    deadline = time.time() + 0.6
    ended: dict[str, tuple[str, float]] = {}

    def turn(name: str, lease: TurnLease, bound: TurnDeadline | None) -> None:
        with LeaseKeeper(lease, interval, bound) as keeper:
            try:
                with keeper.interruptible():
                    gevent.sleep(1.2)  # a silent model call
                ended[name] = ("finished", time.time())
            except (TurnCancelled, TurnTimedOut) as e:
                ended[name] = (type(e).__name__, time.time())

    bound = TurnDeadline(deadline, lambda: TurnTimedOut(0.6))
    turns = [gevent.spawn(turn, "stopped", leases[0], None),
             gevent.spawn(turn, "untouched", leases[1], None),
             gevent.spawn(turn, "timed", leases[2], bound)]
    gevent.sleep(0.05)  # the turns start
    print(json.dumps({"stop": leases[0].conv, "deadline": deadline}), flush=True)
    gevent.joinall(turns, timeout=5)
    print(json.dumps(ended), flush=True)


def test_under_gevent_a_stop_and_a_deadline_interrupt_only_their_own_blocked_turn(
    scratch_redis_url: str,
) -> None:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/3"
    redis.Redis.from_url(url).flushdb()
    code = ("from gevent import monkey; monkey.patch_all(); import sys; "
            "from tests.worker.turn.test_lease_renewer import gevent_child; "
            "gevent_child(sys.argv[1])")
    child = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        ready = json.loads(child.stdout.readline())
        ar = aioredis.Redis.from_url(url, decode_responses=True)

        async def stop() -> float:
            await ar.ping()  # connected first: the stop's own time is what is measured
            await queue.stop_async(ar, ready["stop"])
            written = time.time()  # the stop is in Redis from here (or a moment before)
            await ar.aclose()
            return written

        stopped_at = asyncio.run(stop())
        ended = json.loads(child.stdout.readline())
        assert child.wait(10) == 0
    finally:
        child.kill()
    outcome, at = ended["stopped"]
    assert outcome == "TurnCancelled" and at - stopped_at <= 0.2 + 0.1
    outcome, at = ended["timed"]
    assert outcome == "TurnTimedOut" and 0 <= at - ready["deadline"] < 0.05
    assert ended["untouched"][0] == "finished"
