"""kombu's Redis transport, with one Redis client per channel instead of one per operation.

kombu's Redis channel builds a new ``redis.Redis`` for every publish to a fanout exchange (each
Celery task event) and every acknowledgement (``QoS.pipe_or_acquire``). In redis-py 8 that
constructor is not cheap: it copies ~300 response callbacks into a case-insensitive dict and
reads the package's metadata from disk for its driver info. Profiled under the turn benchmark
it was about a tenth of a worker's CPU (``benchmarks/RESULTS.md``, issue 17). The client is a
thin handle over the channel's connection pool and safe to share, so this channel keeps one,
and builds a new one only when kombu has replaced the pool (after a reconnect).

Selected by the Celery app's ``broker_transport``; the broker URL stays ``redis://...``.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _fermix_client: tuple[Any, Any] | None = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's own long-lived client: kombu already keeps it
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool
        if self._fermix_client is None or self._fermix_client[0] is not pool:
            self._fermix_client = (pool, super()._create_client())  # type: ignore[no-untyped-call]
        return self._fermix_client[1]


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
