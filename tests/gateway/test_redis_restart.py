"""After Redis restarts, the gateway answers normally as soon as Redis does.

A real gateway under uvicorn on a private redis-server (AOF on) with no worker: the test
writes the runs' records and events, as a worker would. Its pool is warm (50 requests at
once) and 50 long-poll waits are open when Redis is stopped (SIGTERM: a clean shutdown) and
started again on the same port and data. Once it answers PING: 200 reads over the pooled
connections, every one answered; the waits that spanned the restart answer with the run's
end, not a 503.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fermix_shared.models import ConversationKey, RunRecord, RunStatus, now
from fermix_shared.stores import runs
from tests.conftest import OwnRedis, Stack, start_stack
from tests.fleet import end_run, open_waits, wait_answers


@pytest.fixture(scope="module")
def stack(own_redis: OwnRedis, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("restart", own_redis.url, 0, {}, logs_dir, workers=0)
    yield s
    s.stop()


def _run(r: redis.Redis, status: RunStatus) -> RunRecord:
    key = ConversationKey(channel="http", chat_id=f"c-{uuid.uuid4().hex[:10]}")
    rec = RunRecord(run_id=f"run_{uuid.uuid4().hex}", conversation=key, status=status,
                    started_at=now(), worker="w1@host")
    if status.terminal:
        rec.ended_at, rec.reply = now(), "done"
    runs.put(r, rec)
    return rec


async def _answers(client: httpx.AsyncClient, paths: list[str], at_once: int) -> list[Any]:
    gate = asyncio.Semaphore(at_once)

    async def one(path: str) -> Any:
        async with gate:
            try:
                return (await client.get(path)).status_code
            except httpx.HTTPError as e:
                return type(e).__name__

    return list(await asyncio.gather(*(one(p) for p in paths)))


def test_after_a_redis_restart_reads_and_open_waits_answer_normally(
    own_redis: OwnRedis, stack: Stack
) -> None:
    r = stack.redis()
    ended = [_run(r, RunStatus.ok) for _ in range(10)]
    open_ = [_run(r, RunStatus.running) for _ in range(50)]
    reads = [p for rec in ended for p in (f"/v1/runs/{rec.run_id}", f"/v1/runs/{rec.run_id}/wait")]
    reads = (reads + ["/v1/status"] * 5) * 8
    assert len(reads) == 200

    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=stack.url, timeout=30, limits=limits) as client:
            warm = await _answers(client, reads[:50], 50)  # 50 at once: a warm pool
            waits = await open_waits(client, r, open_, 15)
            await asyncio.to_thread(own_redis.restart)
            after = await _answers(client, reads, 50)
            back = stack.redis()
            for rec in open_:
                end_run(back, rec)
            return warm, after, await wait_answers(waits)

    warm, after, answered = asyncio.run(main())
    assert warm == [200] * 50
    assert after == [200] * 200, {a: after.count(a) for a in set(after)}
    assert answered == [(200, "ok")] * 50, {a: answered.count(a) for a in set(answered)}


def test_a_wait_started_while_redis_is_down_answers_once_it_is_back(
    own_redis: OwnRedis, stack: Stack
) -> None:
    """A client waiting on a run across a short outage (a restart, a failover) gets the run,
    not a 503: the wait's own reads ride out the outage (fermix_gateway/waits.py)."""
    r = stack.redis()
    ended, open_ = _run(r, RunStatus.ok), _run(r, RunStatus.running)

    async def main() -> list[tuple[int, str]]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
            back = own_redis.restart_after(1.5)  # down for 1.5 s, within the waits' 5 s
            waits = [asyncio.create_task(client.get(f"/v1/runs/{rec.run_id}/wait",
                                                    params={"timeout": 20}))
                     for rec in (ended, open_)]
            await asyncio.to_thread(back.join)
            end_run(stack.redis(), open_)
            answers = await asyncio.gather(*waits)
            return [(a.status_code, a.json().get("status")) for a in answers]

    assert asyncio.run(main()) == [(200, "ok"), (200, "ok")]
