"""kombu's Redis transport, with one Redis client per channel instead of one per operation.

kombu's Redis channel builds a new ``redis.Redis`` for every publish to a fanout exchange (each
Celery task event) and every acknowledgement (``QoS.pipe_or_acquire``). In redis-py 8 that
constructor is not cheap: it copies ~300 response callbacks into a case-insensitive dict and
reads the package's metadata from disk for its driver info. Profiled under the turn benchmark
it was about a tenth of a worker's CPU (``benchmarks/RESULTS.md``, issue 17). The client is a
thin handle over the channel's connection pool and safe to share, so this channel keeps one,
and builds a new one only when kombu has replaced the pool (after a reconnect).

Selected by the Celery app's ``broker_transport``: :data:`TRANSPORT` with a ``redis://...``
broker URL, :data:`SENTINEL_TRANSPORT` with ``sentinel://h:p;sentinel://h:p`` (Sentinel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis

from fermix_shared.sentinel import MasterConnection


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


class Transport(kombu_redis.Transport):
    Channel = Channel


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


TRANSPORT = f"{__name__}:Transport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
