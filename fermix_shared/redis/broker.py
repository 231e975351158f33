"""kombu's Redis transport, with one Redis client per channel instead of one per operation.

kombu's Redis channel builds a new ``redis.Redis`` for every publish to a fanout exchange (each
Celery task event) and every acknowledgement (``QoS.pipe_or_acquire``). In redis-py 8 that
constructor is not cheap: it copies ~300 response callbacks into a case-insensitive dict and
reads the package's metadata from disk for its driver info. Profiled under the turn benchmark
it was about a tenth of a worker's CPU (``benchmarks/RESULTS.md``, issue 17). The client is a
thin handle over the channel's connection pool and safe to share, so this channel keeps one,
and builds a new one only when kombu has replaced the pool (after a reconnect).

Celery's consumer loop (the ``synloop`` a gevent pool uses) drains the broker with a fixed 2 s
timeout, and looks for a SIGTERM only between drains (an idle worker took 3-5 s to start
stopping); kombu registers its ``BRPOP`` only at a drain's start, once the pool has a free
slot, so a slot freed mid-drain waited for the next one (a fan-out's next subagent on a full
pool started up to 2 s late). The transport drains in slices: of :data:`FULL_SLICE_S` while
the pool is full (no ``BRPOP`` can be in flight), so a freed slot takes its next task within
one; of :data:`IDLE_SLICE_S` otherwise, when a ``BRPOP`` waits and a slice only bounds how
long a stop goes unnoticed (the drain returns early once Celery asks the worker to stop).
Slices cost no Redis command, only a wake-up: 50 ms slices all the time doubled an idle
worker's CPU (0.6% to 1.2% of a core).

Selected by the Celery app's ``broker_transport``: :data:`TRANSPORT` with a ``redis://...``
broker URL, :data:`SENTINEL_TRANSPORT` with ``sentinel://h:p;sentinel://h:p`` (Sentinel).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis

from fermix_shared.redis.sentinel import MasterConnection


def _cached_client(channel: Any, create: Callable[[], Any]) -> Any:
    """The channel's one client over its current pool, built again once kombu replaced it."""
    pool = channel.pool
    cached: tuple[Any, Any] | None = channel._fermix_client
    if cached is None or cached[0] is not pool:
        channel._fermix_client = cached = (pool, create())
    return cached[1]


class Channel(kombu_redis.Channel):
    _fermix_client: tuple[Any, Any] | None = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's own long-lived client: kombu already keeps it
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        return _cached_client(self, super()._create_client)


# A drain's slice while the pool is full (how soon a freed slot registers its BRPOP), and
# while a BRPOP waits (how soon a stop is noticed), in seconds.
FULL_SLICE_S = 0.05
IDLE_SLICE_S = 0.25


def _stopping() -> bool:
    """Whether Celery was asked to stop this worker (SIGTERM: warm, SIGQUIT: cold)."""
    from celery.worker import state

    return bool(state.should_stop is not None or state.should_terminate is not None)


def _drain_in_slices(drain: Callable[..., Any], connection: Any, timeout: float | None,
                     slice_s: Callable[[], float] = lambda: IDLE_SLICE_S) -> Any:
    """``drain(connection, timeout=...)`` in slices of ``slice_s()`` seconds: the same
    deliveries, but a timeout (``socket.timeout``, what the caller expects) as soon as the
    worker is stopping. A slice ends only the poll, not a BRPOP in flight (kombu keeps it)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = slice_s() if deadline is None else min(
            slice_s(), max(0.0, deadline - time.monotonic()))
        try:
            return drain(connection, timeout=step)
        except TimeoutError:  # socket.timeout
            if _stopping() or (deadline is not None and time.monotonic() >= deadline):
                raise


def _slice_for(transport: Any) -> Callable[[], float]:
    """The transport's next slice: short while a consuming channel's pool is full."""
    def slice_s() -> float:
        channels = getattr(getattr(transport, "cycle", None), "_channels", ())
        full = any(ch.active_queues and not ch.qos.can_consume() for ch in channels)
        return FULL_SLICE_S if full else IDLE_SLICE_S
    return slice_s


class Transport(kombu_redis.Transport):
    Channel = Channel

    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> Any:
        return _drain_in_slices(super().drain_events, connection, timeout, _slice_for(self))


class SentinelChannel(kombu_redis.SentinelChannel):
    """The same, through Sentinel: kombu builds the pool from the sentinels and the
    ``master_name`` transport option, and builds a new one after a failover."""

    _fermix_client: tuple[Any, Any] | None = None
    # Reconnects through the sentinels (redis-py 8 would retry the dead master's address).
    connection_class = MasterConnection

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        return _cached_client(self, super()._create_client)


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel

    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> Any:
        return _drain_in_slices(super().drain_events, connection, timeout, _slice_for(self))


TRANSPORT = f"{__name__}:Transport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
