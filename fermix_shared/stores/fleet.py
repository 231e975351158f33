"""The fleet as the console's Fleet view and ``GET /v1/fleet`` show it.

What each part writes for it:

* a worker process, at start, its slots (``keys.worker_slots``: concurrent turns), beside the
  heartbeat it already writes (``keys.worker_beats``); its turns in flight are the active
  turns whose lease it holds (``keys.active``'s ``worker``);
* a gateway, every :data:`GATEWAY_BEAT_S`, its name and start time (``keys.gateways``); one
  silent for :data:`GATEWAY_GONE_S` is left out, and dropped by the next gateway's beat;
* every ended turn, one count in its UTC minute by outcome (``keys.turns_per_minute``, kept
  :data:`TURN_COUNT_TTL_S`): turns a minute and errors a minute;
* the beat leader is RedBeat's lock (its key and time left).

Redis itself answers for its role, replicas, memory and persistence (``INFO``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import redis
import redis.asyncio as aioredis

from fermix_shared import keys

GATEWAY_BEAT_S = 5.0
GATEWAY_GONE_S = 30.0
TURN_COUNT_TTL_S = 2 * 3600
MINUTES_SHOWN = 10


def count_turn(r: redis.Redis, status: str, now: float | None = None) -> None:
    """Count one ended turn (``ok``, ``error``, ``stopped``) in its minute."""
    key = keys.turns_per_minute(int((time.time() if now is None else now) // 60))
    with r.pipeline(transaction=False) as pipe:
        pipe.hincrby(key, status, 1)
        pipe.expire(key, TURN_COUNT_TTL_S)
        pipe.execute()


def publish_slots(r: redis.Redis, worker: str, slots: int) -> None:
    """A worker process's concurrent turns, written at its start."""
    r.hset(keys.worker_slots(), worker, slots)


async def gateway_beat_async(r: aioredis.Redis, name: str, started: float,
                             now: float | None = None) -> None:
    """This gateway is alive (``name``: host, port and pid); drop the long-silent ones."""
    now = time.time() if now is None else now
    await r.hset(keys.gateways(), name, json.dumps({"seen": now, "started": started}))
    gone = [n for n, raw in (await r.hgetall(keys.gateways())).items()
            if now - json.loads(raw)["seen"] > 10 * GATEWAY_GONE_S]
    if gone:
        await r.hdel(keys.gateways(), *gone)


async def _in_flight(r: aioredis.Redis) -> Counter[str]:
    convs: list[str] = await r.zrange(keys.active_index(), 0, -1)  # type: ignore[assignment]
    if not convs:
        return Counter()
    async with r.pipeline(transaction=False) as pipe:
        for conv in convs:
            pipe.hget(keys.active(conv), "worker")
        holders = await pipe.execute()
    return Counter(h for h in holders if h)


def _redis_json(info: dict[str, Any]) -> dict[str, Any]:
    return {"role": info.get("role"), "replicas": info.get("connected_slaves", 0),
            "usedMemory": info.get("used_memory_human"), "version": info.get("redis_version"),
            "aof": bool(info.get("aof_enabled")),
            "lastSaveAt": int(info.get("rdb_last_save_time", 0)) * 1000 or None,
            "uptimeSeconds": info.get("uptime_in_seconds")}


async def snapshot_async(r: aioredis.Redis, sentinel: str | None,
                         now: float | None = None) -> dict[str, Any]:
    """The fleet now (``sentinel``: the Sentinel master name the fleet follows, if any)."""
    now = time.time() if now is None else now
    minute = int(now // 60)
    async with r.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.worker_beats())
        pipe.hgetall(keys.worker_slots())
        pipe.hgetall(keys.gateways())
        pipe.pttl(keys.beat_lock())
        for m in range(minute - MINUTES_SHOWN + 1, minute + 1):
            pipe.hgetall(keys.turns_per_minute(m))
        beats, slots, gateways, lock_ms, *minutes = await pipe.execute()
    flight = await _in_flight(r)
    workers = [{"process": name, "node": name.split(":", 1)[0],
                "heartbeatAgoMs": None if float(beat) <= 0 else max(0, int(now * 1000 - float(beat))),
                "stopped": float(beat) <= 0, "slots": int(slots[name]) if name in slots else None,
                "turnsInFlight": flight.get(name, 0)} for name, beat in sorted(beats.items())]
    alive = [{"name": n, "seenAgoMs": int((now - json.loads(v)["seen"]) * 1000),
              "startedAt": int(json.loads(v)["started"] * 1000)}
             for n, v in sorted(gateways.items()) if now - json.loads(v)["seen"] <= GATEWAY_GONE_S]
    info = {**await r.info("replication"), **await r.info("memory"),
            **await r.info("persistence"), **await r.info("server")}
    return {
        "workers": workers, "gateways": alive,
        "beat": {"leader": lock_ms > 0, "lockExpiresInMs": max(0, int(lock_ms))},
        "redis": {**_redis_json(info), "sentinel": sentinel},
        "turnsPerMinute": [{"minute": (minute - MINUTES_SHOWN + 1 + i) * 60_000,
                            "ok": int(m.get("ok", 0)), "error": int(m.get("error", 0)),
                            "stopped": int(m.get("stopped", 0))}
                           for i, m in enumerate(minutes)],
    }
