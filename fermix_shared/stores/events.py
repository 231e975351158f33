"""Run events: a Redis Stream per run, replayable from the start.

Each entry has ``stream`` (lifecycle, assistant, tool, compaction, thinking, diagnostic) and
``data`` (JSON): one of the records of :mod:`fermix_shared.run_events`. The worker writes them;
the gateway serves them as SSE and uses lifecycle end/error entries to wake ``wait``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from fermix_shared import keys
from fermix_shared.run_events import EventStream, RunEventRecord

__all__ = ["EventStream", "RunEvent", "RunEvents", "emit_async", "follow"]


@dataclass(frozen=True)
class RunEvent:
    id: str
    stream: EventStream
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        """A run's last event. A transient error (its worker died, the turn is resuming on
        another) is not terminal: a new ``start`` follows."""
        return (
            self.stream == "lifecycle"
            and self.data.get("phase") in ("end", "error")
            and not self.data.get("transient")
        )


def _fields(event: RunEventRecord) -> dict[FieldT, EncodableT]:
    return {"stream": event.stream, "data": json.dumps(event.data())}


def _xadd(pipe: Any, key: str, event: RunEventRecord) -> None:
    pipe.xadd(key, _fields(event), maxlen=keys.RUN_EVENTS_MAXLEN, approximate=True)
    pipe.expire(key, keys.RUN_TTL_SECONDS)


class RunEvents:
    """Writer side, used by the worker for one run. The stream's TTL is set with a writer's
    first event (a run lasts minutes, the TTL a week), not again with every delta."""

    def __init__(self, r: redis.Redis, run_id: str):
        self._r = r
        self._key = keys.run_events(run_id)
        self._expiring = False

    def emit(self, event: RunEventRecord, pipe: Any = None) -> None:
        """Append ``event``; into the caller's ``pipe`` when given (it runs when the caller
        executes it, with the caller's other writes)."""
        if pipe is None and self._expiring:  # one command, no pipeline needed
            self._r.xadd(self._key, _fields(event), maxlen=keys.RUN_EVENTS_MAXLEN,
                         approximate=True)
            return
        into = self._r.pipeline(transaction=False) if pipe is None else pipe
        if self._expiring:
            into.xadd(self._key, _fields(event), maxlen=keys.RUN_EVENTS_MAXLEN,
                      approximate=True)
        else:  # a writer's first event sets the stream's TTL
            _xadd(into, self._key, event)
        if pipe is None:
            into.execute()
        self._expiring = True


async def emit_async(r: aioredis.Redis, run_id: str, event: RunEventRecord) -> None:
    """Gateway side: for runs the gateway ends itself (commands, cleared messages)."""
    pipe = r.pipeline(transaction=False)
    _xadd(pipe, keys.run_events(run_id), event)
    await pipe.execute()


async def follow(
    r: aioredis.Redis, run_id: str, *, after: str = "0", block_ms: int = 1000
) -> AsyncIterator[RunEvent | None]:
    """Yield the run's events from ``after`` on, forever; ``None`` after each idle block.

    Blocks in slices of ``block_ms`` so callers can check deadlines and disconnects (and so a
    read never outlives the client's socket timeout).
    """
    key = keys.run_events(run_id)
    last = after
    while True:
        resp: Any = await r.xread({key: last}, block=block_ms, count=200)
        if not resp:
            yield None
            continue
        for _name, entries in resp:
            for entry_id, fields in entries:
                last = entry_id
                yield RunEvent(entry_id, fields["stream"], json.loads(fields["data"]))
