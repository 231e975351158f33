"""Every long-poll wait is answered: no pooled client connection closed under a request, and
no Redis connection held per wait.

A real gateway under uvicorn (``fermix gateway``) with no worker: the test writes the runs'
records and events, as a worker would, so runs end when the test says. The 1,000-wait
measurement is ``benchmarks/long_poll.py`` (benchmarks/RESULTS.md); this keeps the two causes
it found, each cheap to show:

* the gateway closed a connection idle for 5 s (uvicorn's default keep-alive), the same
  moment httpx's pool stops reusing one (``keepalive_expiry`` 5 s): a request sent just before
  met the close when the gateway was busy (``RemoteProtocolError``). It now keeps an idle
  connection longer than the clients in front of it (``fermix gateway --keep-alive``);
* each wait blocked in its own ``XREAD`` on a pooled Redis connection, so past the pool's 500
  connections waits queued for one and answered 503. Now one reader serves all the waits.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import redis

from fermix_shared.models import ConversationKey, RunRecord, RunStatus, now
from fermix_shared.run_events import RunStarted
from fermix_shared.stores import runs
from fermix_shared.stores.events import RunEvents
from tests.conftest import Stack, start_stack
from tests.fleet import end_run, open_waits, wait_answers

WAITS = 200
DB = 13


@pytest.fixture(scope="module")
def stack(redis_url: str, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("long-poll", redis_url, DB, {}, logs_dir, workers=0)
    yield s
    s.stop()


def _exchange(sock: socket.socket, conn: h11.Connection, path: str) -> int:
    """One request on ``sock``; the response's status (the body is read and dropped)."""
    sock.sendall(conn.send(h11.Request(method="GET", target=path, headers=[("Host", "gw")])))
    sock.sendall(conn.send(h11.EndOfMessage()))
    status = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            conn.start_next_cycle()
            return status
        elif isinstance(event, h11.ConnectionClosed):
            raise AssertionError("the gateway closed the connection without an answer")


def test_an_idle_connection_stays_open_longer_than_httpx_reuses_it(stack: Stack) -> None:
    expiry = httpx.Limits().keepalive_expiry  # what a pooled httpx client reuses: 5 s
    assert expiry is not None
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        conn = h11.Connection(h11.CLIENT)
        assert _exchange(sock, conn, "/healthz") == 200
        idle_from = time.monotonic()
        # Idle past the client's expiry (plus a margin for a busy gateway): the gateway must
        # not be the side that closes, or a request sent just before the expiry meets it.
        readable, _, _ = select.select([sock], [], [], expiry + 1.0)
        if readable:
            assert sock.recv(1, socket.MSG_PEEK) != b"", (
                f"the gateway closed an idle connection after {time.monotonic() - idle_from:.1f}"
                f" s, while httpx reuses one for {expiry:.0f} s")
        assert _exchange(sock, conn, "/healthz") == 200


def _running(r: redis.Redis) -> RunRecord:
    key = ConversationKey(channel="http", chat_id=f"c-{uuid.uuid4().hex[:10]}")
    rec = RunRecord(run_id=f"run_{uuid.uuid4().hex}", conversation=key,
                    status=RunStatus.running, started_at=now(), worker="w1@host")
    runs.put(r, rec)
    RunEvents(r, rec.run_id).emit(RunStarted(started_at=rec.started_at, resumed=False))
    return rec


def _blocked_readers(r: redis.Redis) -> int:
    """The gateway's connections blocked reading run events now (this database only)."""
    return sum(1 for c in r.client_list()
               if c["db"] == str(DB) and c["cmd"] == "xread" and "b" in c["flags"])


def test_concurrent_waits_share_one_redis_read_and_all_answer(stack: Stack) -> None:
    r = stack.redis()
    recs = [_running(r) for _ in range(WAITS)]

    async def main() -> tuple[int, list[Any]]:
        limits = httpx.Limits(max_connections=WAITS, max_keepalive_connections=WAITS)
        async with httpx.AsyncClient(base_url=stack.url, timeout=30, limits=limits) as client:
            # Every wait has read its record, and the gateway has read events twice since.
            waits = await open_waits(client, r, recs, 30)
            blocked = max(_blocked_readers(r) for _ in range(5))
            for rec in recs:
                end_run(r, rec)
            return blocked, await wait_answers(waits)

    # Every wait answers "ok", the run's end, not "timeout" (how fast is measured by
    # benchmarks/long_poll.py, not asserted here).
    blocked, answers = asyncio.run(main())
    assert answers == [(200, "ok")] * WAITS, {a: answers.count(a) for a in set(answers)}
    # One reader for all of them, not a pooled Redis connection per wait (500 at most: the
    # 501st wait queued for one, and past 2 s answered 503).
    assert blocked == 1, f"{blocked} connections blocked reading events for {WAITS} waits"
