"""The durability wait: what must be on a replica before the gateway answers an accepted
message, and before a worker sends a reply to a platform.

Replication is asynchronous: a message the primary acknowledged can vanish if the primary dies
before a replica has it. So the gateway, after the durable write of an inbound message and
before it answers, runs ``WAIT n timeout`` on the connection that wrote it
(:func:`write_session`, :class:`AcceptWait`); fewer than ``n`` replicas acknowledging is
:class:`NotReplicated`, answered 503 with ``Retry-After`` (the platforms retry; the
de-duplication key makes the retry safe). A worker waits the same way for its mark that a
reply is being delivered, before the platform send (:class:`DeliveryWait`). ``n`` follows
``FERMIX_REDIS_WAIT_REPLICAS`` (:mod:`fermix_shared.redis.replicas`): ``auto`` (unset with Sentinel,
:mod:`fermix_shared.redis.sentinel`) waits for one replica while the primary has one connected and
for none while it has none (so a failover to the only replica keeps accepting); ``N`` always
waits for ``N`` (run ``N + 1`` replicas so that a failover still leaves ``N``); unset without
Sentinel, 0: no WAIT and no extra round trip. The timeout is ``FERMIX_REDIS_WAIT_TIMEOUT_MS``
(500).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager, closing, nullcontext
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError
from redis.retry import Retry

from fermix_shared.errors import FermixError
from fermix_shared.redis.replicas import ReplicaWatch, WaitRule, connected_replicas

# What a refused accept tells the platform to wait before it retries (seconds).
NOT_REPLICATED_RETRY_AFTER_S = 1

_NO_RETRY = AsyncRetry(NoBackoff(), 0)
_NO_RETRY_SYNC = Retry(NoBackoff(), 0)


class NotReplicated(FermixError, RedisError):
    """Fewer replicas than asked acknowledged a write within the wait: the write is on the
    primary only and could be lost with it. The gateway answers 503 with Retry-After."""

    def __init__(self, wanted: int, acknowledged: int, timeout_ms: int):
        super().__init__(f"{acknowledged} of {wanted} replica(s) acknowledged the write "
                         f"within {timeout_ms} ms")
        self.wanted, self.acknowledged = wanted, acknowledged


async def replication_shortfall(r: aioredis.Redis, replicas: int, timeout_ms: int
                                ) -> NotReplicated | None:
    """``WAIT replicas timeout_ms``: None when enough replicas acknowledged this connection's
    writes, else the :class:`NotReplicated` to answer with. ``replicas`` 0 sends nothing.

    WAIT covers the writes made on the connection it runs on, so ``r`` must be the one that
    wrote: :func:`write_session`.
    """
    if replicas <= 0:
        return None
    # Never retried: a WAIT re-sent on a reconnected connection covers nothing that connection
    # wrote, and would report the write replicated when it may not be.
    conn = r.connection
    if conn is None:  # not a write_session: nothing to bind the WAIT to
        raise RuntimeError("replication_shortfall needs write_session's client")
    saved, conn.retry = conn.retry, _NO_RETRY
    try:
        acknowledged = int(await r.wait(replicas, timeout_ms))
    except (ConnectionError, TimeoutError):
        return NotReplicated(replicas, 0, timeout_ms)
    finally:
        conn.retry = saved
    return None if acknowledged >= replicas else NotReplicated(replicas, acknowledged, timeout_ms)


@asynccontextmanager
async def write_session(r: aioredis.Redis, replicas: int) -> AsyncIterator[aioredis.Redis]:
    """``r`` itself when no WAIT follows (``replicas`` 0: no cost), else a client bound to one
    pooled connection for the write and its WAIT, released on leaving."""
    if replicas <= 0:
        yield r
        return
    conn = r.client()
    try:
        yield conn
    finally:
        await conn.aclose()


class AcceptWait:
    """The gateway's durability wait at accept, under the ``FERMIX_REDIS_WAIT_REPLICAS`` rule
    (:mod:`fermix_shared.redis.replicas`): ``wanted`` before the write, ``settle`` after it, on the
    connection that wrote (:func:`write_session`)."""

    def __init__(self, rule: WaitRule, timeout_ms: int):
        self.watch = ReplicaWatch(rule, "accept")
        self.timeout_ms = timeout_ms

    async def wanted(self, r: aioredis.Redis) -> int:
        """Replicas this accept waits for: under ``auto``, 0 while the primary has none."""
        watch = self.watch
        if not watch.rule.strict and watch.rule.replicas and watch.stale():
            await self._read(r)
        return watch.wanted()

    async def settle(self, conn: aioredis.Redis, wanted: int) -> NotReplicated | None:
        """After the write: None to answer normally, else the 503 to answer with."""
        watch = self.watch
        if watch.rule.replicas == 0:
            return None
        if wanted == 0:
            watch.unreplicated_write()
            return None
        short = await replication_shortfall(conn, wanted, self.timeout_ms)
        if short is None:
            watch.replicated_write()
            return None
        if watch.rule.strict:
            return short
        # auto: short because the replica is slow (503), or because there is none any more.
        if await self._read(conn) == 0:
            watch.unreplicated_write()
            return None
        return short

    async def status(self, r: aioredis.Redis) -> dict[str, Any]:
        """The ``redis.replicas`` detail of ``/healthz`` (the count read if stale)."""
        if self.watch.stale():
            await self._read(r)
        return self.watch.status()

    async def _read(self, r: aioredis.Redis) -> int | None:
        self.watch.reading()
        try:
            n = connected_replicas(await r.role())
        except RedisError:
            self.watch.unread()
            return self.watch.connected
        self.watch.saw(n)
        return n


class DeliveryWait:
    """A worker's wait before a platform send: the mark that the reply is being delivered
    (begin_delivery.lua) on a replica first, so a failover cannot run the turn again and send
    it twice. Same rule as :class:`AcceptWait`; a shortfall is counted (one WARNING until a
    mark is acknowledged again), and the send goes ahead (a reply held back forever is worse
    than one that may repeat).

    The mark's value is the primary's replication id (``INFO replication`` ``master_replid``:
    a promoted replica takes a new one), as this process last read it, at most a second ago
    (:meth:`mark`). A turn recovered on another worker compares it with the primary's id then
    (:meth:`failed_over_since`): the same id, the chunk marks written after each send are
    there and the delivery resumes (what was sent is skipped); another id or none, a failover
    may have lost them, and the reply is committed without sending it again."""

    def __init__(self, r: redis.Redis, rule: WaitRule, timeout_ms: int):
        self._r = r
        self.watch = ReplicaWatch(rule, "delivery")
        self.timeout_ms = timeout_ms
        self._replid = ""  # the primary's replication id, last read; "": not read

    def pinned(self) -> AbstractContextManager[redis.Redis]:
        """The client itself when nothing is waited for, else a client of its pool on one
        connection (WAIT covers the writes of its own connection), released on leaving."""
        if self.watch.rule.replicas == 0:
            return nullcontext(self._r)
        return closing(self._r.client())  # type: ignore[no-untyped-call]

    def mark(self, conn: redis.Redis) -> str:
        """The delivering mark's value: ``"1"`` without a rule, else the primary's replication
        id (read with the replica count, when that is stale: at most once a second)."""
        if self.watch.rule.replicas == 0:
            return "1"
        if self.watch.stale() or not self._replid:
            self._read(conn)
        return self._replid

    def failed_over_since(self, mark: str) -> bool:
        """Whether the primary is not the one a ``mark`` was written on (a failover came
        between, or the mark holds no id): never without a rule (no WAIT, no failover
        handling: a recovered delivery resumes, as it always did)."""
        if self.watch.rule.replicas == 0:
            return False
        try:
            self._replid = replication_id(self._r.info("replication"))
        except RedisError:
            return True
        return not mark or mark != self._replid

    def after_mark(self, conn: redis.Redis) -> None:
        """WAIT for the mark ``conn`` just wrote, under the rule."""
        watch = self.watch
        if watch.rule.replicas == 0:
            return
        if not watch.rule.strict and watch.stale():
            self._read(conn)
        wanted = watch.wanted()
        if wanted == 0:
            watch.unreplicated_write()
            return
        acknowledged = _sync_wait(conn, wanted, self.timeout_ms)
        if acknowledged >= wanted:
            watch.replicated_write()
            return
        if not watch.rule.strict and self._read(conn) == 0:
            watch.unreplicated_write()
            return
        # Sent anyway: a reply held back is worse than one a failover might repeat.
        watch.unreplicated_write(f"had {acknowledged} of {wanted} replica(s) acknowledge a "
                                 f"delivery mark within {self.timeout_ms} ms")

    def _read(self, r: redis.Redis) -> int | None:
        """``ROLE`` and ``INFO replication`` in one round trip: the count, the id."""
        self.watch.reading()
        try:
            pipe = r.pipeline(transaction=False)
            pipe.role()
            pipe.info("replication")
            role, info = pipe.execute()
        except RedisError:
            self.watch.unread()
            return self.watch.connected
        n = connected_replicas(role)
        self._replid = replication_id(info)
        self.watch.saw(n)
        return n


def replication_id(info: Any) -> str:
    """``master_replid`` of an ``INFO replication`` reply ("" when absent)."""
    value = info.get("master_replid") if isinstance(info, dict) else None
    return "" if value is None else str(value)


def _sync_wait(conn: redis.Redis, replicas: int, timeout_ms: int) -> int:
    """``WAIT`` on ``conn``'s one connection, never retried (see :func:`replication_shortfall`);
    0 when the connection fails."""
    c = conn.connection
    if c is None:
        raise RuntimeError("a WAIT needs a client pinned to one connection")
    saved, c.retry = c.retry, _NO_RETRY_SYNC
    try:
        return int(conn.wait(replicas, timeout_ms))
    except (ConnectionError, TimeoutError):
        return 0
    finally:
        c.retry = saved
