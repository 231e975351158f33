"""A run's model calls, for its timeline (the console's run view, ``GET
/v1/runs/{runId}/timeline``): one entry per call its chain answered or failed, written by the
metered router (fermix_worker/usage/metered.py) with what it cost and how long it took. A
subagent's and a skill run's calls are their parent run's, marked by ``kind``. Kept as long as
the run's events (``RUN_TTL_SECONDS``); at most :data:`MAX_CALLS` a run.

The rest of a timeline comes from the run's events, whose stream ids are their times: tool
calls (start to result), compaction, diagnostics (retries, failover, overflow recovery).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from fermix_shared import keys

MAX_CALLS = 1000


@dataclass(frozen=True)
class ModelCall:
    """One model call: when it started (ms), how long it took, what made it, the model, the
    tokens the provider reported and the cost (micro-dollars; 0 unpriced or failed), or the
    error that ended it."""

    at_ms: int
    latency_ms: int
    kind: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    usd_micros: int = 0
    error: str = ""

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"at": d.pop("at_ms"), "latencyMs": d.pop("latency_ms"), "kind": d.pop("kind"),
                "model": d.pop("model"), "inputTokens": d.pop("input_tokens"),
                "outputTokens": d.pop("output_tokens"),
                "cacheReadTokens": d.pop("cache_read_tokens"),
                "cacheWriteTokens": d.pop("cache_write_tokens"),
                "reasoningTokens": d.pop("reasoning_tokens"), "usdMicros": d.pop("usd_micros"),
                "error": d.pop("error") or None}


def record_call(r: redis.Redis, run_id: str, call: ModelCall,
                via: redis.client.Pipeline | None = None) -> None:
    """Append ``call`` to the run's timeline (``via``: queued on that pipeline, which the
    caller runs)."""
    if via is not None:
        _queue_call(via, run_id, call)
        return
    with r.pipeline(transaction=False) as pipe:
        _queue_call(pipe, run_id, call)
        pipe.execute()


def _queue_call(pipe: redis.client.Pipeline, run_id: str, call: ModelCall) -> None:
    key = keys.run_calls(run_id)
    pipe.rpush(key, json.dumps(asdict(call)))
    pipe.ltrim(key, -MAX_CALLS, -1)
    pipe.expire(key, keys.RUN_TTL_SECONDS)


async def calls_async(r: aioredis.Redis, run_id: str) -> list[ModelCall]:
    """The run's model calls, in the order they ended."""
    raw = await r.lrange(keys.run_calls(run_id), 0, -1)
    return [ModelCall(**json.loads(x)) for x in raw]


def _event_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


def _from_events(entries: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
    """Tool calls (start to result, with their duration), compaction, diagnostics and the
    run's start and end, from its event stream."""
    out: list[dict[str, Any]] = []
    started: dict[str, tuple[int, dict[str, Any]]] = {}
    for entry_id, fields in entries:
        stream, data, at = fields.get("stream", ""), json.loads(fields.get("data", "{}")), \
            _event_ms(entry_id)
        if stream == "tool" and data.get("phase") == "start":
            started[str(data.get("callId"))] = (at, data)
        elif stream == "tool" and data.get("phase") == "result":
            begun, first = started.pop(str(data.get("callId")), (at, data))
            out.append({"at": begun, "type": "tool", "name": first.get("name"),
                        "callId": data.get("callId"), "durationMs": at - begun,
                        "isError": bool(data.get("isError")), "result": data.get("result")})
        elif stream in ("compaction", "diagnostic", "lifecycle"):
            out.append({"at": at, "type": stream, **data})
    out += [{"at": at, "type": "tool", "name": d.get("name"), "callId": call_id,
             "durationMs": None, "isError": False, "result": None}
            for call_id, (at, d) in started.items()]
    return out


async def timeline_async(r: aioredis.Redis, run_id: str) -> list[dict[str, Any]]:
    """The run's timeline, oldest first: its model calls (tokens, cost, latency), tool calls
    (duration, result when the run is verbose), compaction, diagnostics (retries, failover,
    overflow recovery), its start and end."""
    entries: list[tuple[str, dict[str, str]]] = await r.xrange(  # type: ignore[assignment]
        keys.run_events(run_id), "-", "+")
    calls = [{"type": "model", **c.as_json()} for c in await calls_async(r, run_id)]
    return sorted([*calls, *_from_events(entries)], key=lambda e: int(e["at"]))
