"""The worker's graceful stop on a real Redis, in-process: a turn still running at the grace is
interrupted (HandedOff), and once it has left, the stopped worker's lease ends and the
conversation is dispatched, so another worker's claim resumes it at once. The end-to-end
version with real processes is tests/worker/fleet/test_graceful_restart.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from fermix_shared.stores import queue
from fermix_worker.fleet.heartbeat import Heartbeat
from fermix_worker.fleet.shutdown import GracefulStop, release_held
from fermix_worker.turn import lease as lease_module
from fermix_worker.turn.lease import HandedOff, LeaseKeeper
from tests.worker.turn.test_lease_renewer import LEASE_S, WORKER, busy, raises, until

GRACE_S = 0.05


@pytest.fixture
def stopping() -> Iterator[None]:
    yield
    # The hand-over is for the rest of the process's life; later tests are a new "process".
    lease_module._handing_off.clear()


def test_a_turn_past_the_grace_is_handed_off_and_resumes_elsewhere_at_once(
    r: redis.Redis, stopping: None
) -> None:
    lease = busy(r)
    heartbeat = Heartbeat(r, WORKER, "node", 1.0)
    heartbeat.beat()
    kicked: list[str] = []
    released = threading.Event()

    def release() -> None:
        heartbeat.mark_stopped()
        release_held(r, WORKER, kicked.append)
        released.set()

    graceful = GracefulStop(GRACE_S, release)
    with LeaseKeeper(lease, 0.05) as keeper:
        graceful.begin()
        keeper.check()  # within the grace the turn runs on
        until(lambda: raises(keeper.check, HandedOff), 1.0, "the hand-over")
        assert not released.is_set()  # the turn has not left yet
    assert released.wait(2.0)
    assert graceful.handed_off == 1
    assert kicked == [lease.conv]
    # The dispatch it sent finds the turn's lease ended: another worker resumes it now,
    # not after the 30 s lease or the 5 s dead-worker threshold.
    claim, resumed = queue.claim(r, lease.conv, "w2@host", LEASE_S)
    assert claim.kind == "orphan" and resumed is not None and resumed.worker == "w2@host"


def test_turns_that_end_within_the_grace_are_not_handed_off(
    r: redis.Redis, stopping: None
) -> None:
    released = threading.Event()
    graceful = GracefulStop(GRACE_S, released.set)
    with LeaseKeeper(busy(r), 0.05) as keeper:
        graceful.begin()
        keeper.check()
    graceful.end()  # the pool stopped: every turn finished
    time.sleep(3 * GRACE_S)  # nothing may happen now: there is no event to wait for
    assert graceful.handed_off == 0 and not released.is_set()
    with LeaseKeeper(busy(r), 0.05) as later:
        later.check()  # this process still takes turns
