"""Run records: one JSON value per run, read by ``GET /v1/runs/{id}``."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.models import RunRecord


def get(r: redis.Redis, run_id: str) -> RunRecord | None:
    raw = r.get(keys.run(run_id))
    return RunRecord.model_validate_json(raw) if raw else None


async def get_async(r: aioredis.Redis, run_id: str) -> RunRecord | None:
    raw = await r.get(keys.run(run_id))
    return RunRecord.model_validate_json(raw) if raw else None


async def recent_of_async(r: aioredis.Redis, conv: str, limit: int = 20) -> list[RunRecord]:
    """The conversation's newest runs (at most 50 are kept), newest first; those whose record
    expired are left out."""
    ids: list[str] = await r.zrevrange(keys.conv_runs(conv), 0, limit - 1)  # type: ignore[assignment]
    raw = await r.mget([keys.run(i) for i in ids]) if ids else []
    return [RunRecord.model_validate_json(x) for x in raw if x]


def put(r: redis.Redis | redis.client.Pipeline, record: RunRecord) -> None:
    """Write ``record`` (a week's TTL); queued only, when ``r`` is a pipeline."""
    r.set(keys.run(record.run_id), record.model_dump_json(), ex=keys.RUN_TTL_SECONDS)


async def put_async(r: aioredis.Redis, record: RunRecord) -> None:
    await r.set(keys.run(record.run_id), record.model_dump_json(), ex=keys.RUN_TTL_SECONDS)
