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

from fermix_dev.procs import start_redis, wait_until
from fermix_shared.models import ConversationKey, RunRecord, RunStatus, now
from fermix_shared.stores import runs
from fermix_shared.stores.events import RunEvents
from tests.conftest import Stack, start_stack


class OwnRedis:
    def __init__(self, data: Path, logs: Path):
        self.data, self.logs = data, logs
        self.proc, self.url = start_redis(data, log_path=logs / "restart-redis.log")
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def restart(self) -> None:
        """SIGTERM (the AOF is complete), then start it again; returns once it answers PING."""
        self.proc.stop()
        self.proc, _ = start_redis(self.data, self.port, self.logs / "restart-redis-2.log")


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory, logs_dir: Path) -> Iterator[OwnRedis]:
    o = OwnRedis(tmp_path_factory.mktemp("restart-redis"), logs_dir)
    yield o
    o.proc.stop()


@pytest.fixture(scope="module")
def stack(own: OwnRedis, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("restart", own.url, 0, {}, logs_dir, workers=0)
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


def _end(r: redis.Redis, rec: RunRecord) -> None:
    """What a worker does when a turn ends: the record, then the terminal event."""
    rec.status, rec.ended_at, rec.reply = RunStatus.ok, now(), f"reply to {rec.run_id}"
    runs.put(r, rec)
    RunEvents(r, rec.run_id).emit("lifecycle", phase="end", endedAt=rec.ended_at, status="ok",
                                  reply=rec.reply)


def _calls(r: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


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
    own: OwnRedis, stack: Stack
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
            gets = _calls(r, "get")
            waits = [asyncio.create_task(client.get(f"/v1/runs/{rec.run_id}/wait",
                                                    params={"timeout": 30})) for rec in open_]

            def following() -> bool:
                # Every wait has read its record, and the gateway has read events since.
                return _calls(r, "get") >= gets + len(open_)

            await asyncio.to_thread(wait_until, following, 15, "the 50 waits open")
            xreads = _calls(r, "xread")
            await asyncio.to_thread(wait_until, lambda: _calls(r, "xread") >= xreads + 2, 5,
                                    "the waits reading events")
            await asyncio.to_thread(own.restart)
            after = await _answers(client, reads, 50)
            back = stack.redis()
            for rec in open_:
                _end(back, rec)
            answered: list[tuple[int | str, Any]] = []
            for w in waits:
                try:
                    resp = await w
                    answered.append((resp.status_code, resp.json().get("status")))
                except httpx.HTTPError as e:
                    answered.append((type(e).__name__, None))
            return warm, after, answered

    warm, after, answered = asyncio.run(main())
    assert warm == [200] * 50
    assert after == [200] * 200, {a: after.count(a) for a in set(after)}
    assert answered == [(200, "ok")] * 50, {a: answered.count(a) for a in set(answered)}
