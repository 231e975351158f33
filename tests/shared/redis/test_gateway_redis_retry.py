"""The gateway's Redis client sends a command again after a dropped connection only when
repeating it is harmless (fermix_shared/redis/client.py ``REPEATABLE``).

Real redis-server (the scratch one); the connection is dropped by Redis itself
(``CLIENT KILL``) while the command is blocked on the server, so it was sent and is running:
a read is answered on a fresh connection, a write is not sent a second time.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_shared.redis.client import ReplyLost, make_async_redis, repeatable

CONNECT_TIMEOUT_S = 1.0  # the gateway's socket_connect_timeout


def _blocked(r: redis.Redis, command: str, not_id: int | None = None) -> dict[str, Any] | None:
    for c in r.client_list():
        if c["cmd"] == command and "b" in c["flags"] and int(c["id"]) != not_id:
            return c
    return None


def _calls(r: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_reads_and_plain_sets_are_repeatable_scripts_and_counters_are_not() -> None:
    assert repeatable(("GET", "k")) and repeatable(("XREAD", "BLOCK", 250, "STREAMS", "s", "0"))
    assert repeatable(("SET", "k", "v")) and repeatable(("SET", "k", "v", "EX", 60))
    assert not repeatable(("SET", "k", "v", "NX"))  # a repeat would answer "not first"
    assert not repeatable(("SET", "k", "v", "EX", 60, "NX"))
    for write in (("EVALSHA", "abc", 1, "k"), ("XADD", "s", "*", "f", "v"), ("INCR", "k"),
                  ("RPUSH", "l", "x"), ("DEL", "k")):
        assert not repeatable(write), write
    # A transaction is as repeatable as what it holds (the frame itself changes nothing).
    assert repeatable(("MULTI",)) and repeatable(("EXEC",))


def test_a_read_whose_connection_drops_is_answered_on_a_fresh_connection(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def main() -> Any:
        client = make_async_redis(scratch_redis_url)
        try:
            read: asyncio.Future[Any] = asyncio.ensure_future(
                client.xread({stream: "0"}, block=10_000))
            await asyncio.to_thread(wait_until, lambda: _blocked(r, "xread") is not None, 5,
                                    "the read blocked in Redis")
            first = _blocked(r, "xread")
            assert first is not None
            r.client_kill_filter(_id=first["id"])
            # The same read again, on another connection: its answer is the reply.
            await asyncio.to_thread(
                wait_until, lambda: _blocked(r, "xread", not_id=int(first["id"])) is not None,
                5, "the read sent again")
            r.xadd(stream, {"stream": "lifecycle", "data": "{}"})
            return await asyncio.wait_for(read, 5)
        finally:
            await client.aclose()

    resp = asyncio.run(main())
    assert resp and resp[0][0] == stream and len(resp[0][1]) == 1


def test_a_write_whose_connection_drops_is_not_sent_again(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    src, dst = f"src-{uuid.uuid4().hex[:8]}", f"dst-{uuid.uuid4().hex[:8]}"
    before = _calls(r, "blmove")

    async def main() -> None:
        client = make_async_redis(scratch_redis_url)
        try:
            move: asyncio.Future[Any] = asyncio.ensure_future(
                client.blmove(src, dst, 3, "LEFT", "RIGHT"))
            await asyncio.to_thread(wait_until, lambda: _blocked(r, "blmove") is not None, 5,
                                    "the write blocked in Redis")
            victim = _blocked(r, "blmove")
            assert victim is not None
            r.client_kill_filter(_id=victim["id"])
            with pytest.raises(ReplyLost):
                await asyncio.wait_for(move, 5)
        finally:
            await client.aclose()

    asyncio.run(main())
    assert _calls(r, "blmove") == before + 1  # sent once: a write that may have run


@pytest.fixture
def full_listener() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops new SYNs, so a connect times out
    (what a Redis host that is down, or swamped, looks like)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        fillers = []
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.1)  # the fillers' handshakes (no event to wait on: the kernel's)
        try:
            yield port
        finally:
            for s in fillers:
                s.close()


def test_a_connection_that_times_out_is_tried_again_as_a_connection_error(
    full_listener: int
) -> None:
    async def main() -> tuple[BaseException, float]:
        client = make_async_redis(f"redis://127.0.0.1:{full_listener}/0")
        began = time.monotonic()
        try:
            await client.get("k")
        except redis.RedisError as e:
            return e, time.monotonic() - began
        finally:
            await client.aclose()
        raise AssertionError("a GET answered by a port that accepts nothing")

    error, took = asyncio.run(main())
    # Nothing was sent, so any command may be tried again: a ConnectionError (retried once),
    # not redis-py's TimeoutError (never retried).
    assert isinstance(error, redis.ConnectionError), repr(error)
    assert "timed out connecting" in str(error)
    assert 2 * CONNECT_TIMEOUT_S - 0.1 <= took < 2 * CONNECT_TIMEOUT_S + 1.0, took
