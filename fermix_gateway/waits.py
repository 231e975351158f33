"""One blocking read of run events for every long-poll wait of a gateway process.

``GET /v1/runs/{id}/wait`` used to block in its own ``XREAD`` (250 ms at a time, over and over):
a pooled Redis connection held per wait. 1,000 concurrent waits asked 4,000 XREADs a second of
a 500-connection pool, so some requests waited past the pool's 2 s for a connection and
answered 503 (benchmarks/RESULTS.md, "Issue 25: long-poll capacity"). Here the waits of a process share one reader: one ``XREAD BLOCK`` over
every stream being waited on, its entries handed to each waiter of that stream. A wait costs
one ``XRANGE`` when it starts (what the stream holds already) and nothing while it blocks.

The reader runs only while someone waits (cancelled when the last wait ends: nothing to
stop at shutdown, no blocked read left behind). A wait rides out a short Redis outage (a
restart, a failover): the reader tries again every 0.1 s and, once Redis answers, goes on
from the last entry each waiter saw (nothing is missed: the streams persist). Only when
Redis has been failing for :data:`OUTAGE_GRACE_S` do the waiters get the error (a 503); a
wait that starts during an outage fails at once on its first read, as any request does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from fermix_shared import keys
from fermix_shared.stores.events import RunEvent

log = logging.getLogger(__name__)

# The reader's block (ms): how long it may take to notice a stream added to the set.
READ_BLOCK_MS = 250
# Entries read per stream per XREAD (as events.follow).
READ_COUNT = 200
# After a failed read, before the next (seconds): a Redis that is down is not hammered.
ERROR_PAUSE_S = 0.1
# How long waits ride out a Redis that cannot be read before they answer 503 (seconds): a
# restart or a Sentinel failover takes a few.
OUTAGE_GRACE_S = 5.0


T = TypeVar("T")


class _Outage:
    """How long Redis has been failing a reader, said once when it starts and once when it
    ends."""

    def __init__(self, what: str, grace_s: float = OUTAGE_GRACE_S):
        self._what, self._grace_s = what, grace_s
        self._since: float | None = None

    def failed(self, e: RedisError) -> bool:
        """Count a failure; whether Redis has now been failing for the grace or longer."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
            log.warning("%s cannot read Redis, trying again: %s", self._what, e)
        return now - self._since >= self._grace_s

    def ended(self) -> None:
        """A read succeeded."""
        if self._since is not None:
            log.info("%s reads Redis again after %.1f s", self._what,
                     time.monotonic() - self._since)
            self._since = None


async def ride_out(read: Callable[[], Awaitable[T]], grace_s: float = OUTAGE_GRACE_S) -> T:
    """``read()``, tried again every :data:`ERROR_PAUSE_S` while Redis fails, until it has
    failed for ``grace_s`` (then its error: a 503). For reads only: nothing is written twice."""
    outage = _Outage("a wait", grace_s)
    while True:
        try:
            result = await read()
        except RedisError as e:
            if outage.failed(e):
                raise
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        outage.ended()
        return result


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class _Waiter:
    key: str
    last: str
    inbox: asyncio.Queue[RunEvent | RedisError] = field(default_factory=asyncio.Queue)


def _event(entry_id: str, fields: dict[str, Any]) -> RunEvent:
    return RunEvent(entry_id, fields["stream"], json.loads(fields["data"]))


class RunWaits:
    """The process's waits on run event streams (one per gateway app, ``app.state``)."""

    def __init__(self, r: aioredis.Redis, block_ms: int = READ_BLOCK_MS):
        self._r = r
        self._block_ms = block_ms
        self._waiters: dict[str, set[_Waiter]] = {}
        self._reader: asyncio.Task[None] | None = None

    @property
    def redis(self) -> aioredis.Redis:
        return self._r

    @property
    def waiting(self) -> int:
        """Waits registered now (one reader serves them all)."""
        return sum(len(s) for s in self._waiters.values())

    async def follow(self, run_id: str, idle_s: float = READ_BLOCK_MS / 1000,
                     grace_s: float = OUTAGE_GRACE_S) -> AsyncGenerator[RunEvent | None, None]:
        """The run's events from the start, forever, as :func:`events.follow` yields them;
        ``None`` after each ``idle_s`` without one (callers check deadlines then). The first
        read rides out ``grace_s`` of outage (:func:`ride_out`)."""
        key = keys.run_events(run_id)
        backlog: Any = await ride_out(lambda: self._r.xrange(key, "-", "+"), grace_s)
        last = "0-0"
        for entry_id, fields in backlog:
            last = entry_id
            yield _event(entry_id, fields)
        waiter = _Waiter(key, last)
        self._add(waiter)
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_s):
                        item = await waiter.inbox.get()
                except TimeoutError:
                    yield None
                    continue
                if isinstance(item, RedisError):
                    raise item
                yield item
        finally:
            self._remove(waiter)

    def _add(self, waiter: _Waiter) -> None:
        self._waiters.setdefault(waiter.key, set()).add(waiter)
        if (self._reader is None or self._reader.done()
                or self._reader.get_loop() is not asyncio.get_running_loop()):
            self._reader = asyncio.create_task(self._read(), name="fermix-run-waits")

    def _remove(self, waiter: _Waiter) -> None:
        group = self._waiters.get(waiter.key)
        if group is not None:
            group.discard(waiter)
            if not group:
                del self._waiters[waiter.key]
        if not self._waiters and self._reader is not None:
            # Nobody waits: its blocked read would only outlive the last wait.
            self._reader.cancel()
            self._reader = None

    async def _read(self) -> None:
        outage = _Outage("the waits' reader of run events")
        while self._waiters:
            # Each stream from the earliest entry one of its waiters has not seen.
            streams: dict[Any, Any] = {key: min((w.last for w in group), key=_order)
                                       for key, group in self._waiters.items()}
            try:
                resp: Any = await self._r.xread(streams, block=self._block_ms, count=READ_COUNT)
            except RedisError as e:
                if outage.failed(e):
                    for group in self._waiters.values():
                        for w in group:
                            w.inbox.put_nowait(e)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            outage.ended()
            for key, entries in resp or ():
                for w in list(self._waiters.get(key, ())):
                    seen = _order(w.last)
                    for entry_id, fields in entries:
                        if _order(entry_id) <= seen:
                            continue
                        w.last = entry_id
                        try:
                            w.inbox.put_nowait(_event(entry_id, fields))
                        except (KeyError, TypeError, ValueError):  # not an event Fermix wrote
                            log.warning("skipped a malformed run event %s in %s", entry_id, key)
