"""Redis clients, created lazily under a lock (many greenlets start at once).

redis-py raises at once when a plain pool is full; a BlockingConnectionPool waits for a free
connection instead, which is what a worker with hundreds of concurrent turns needs.

The two kinds of client treat an outage differently, on purpose:

* **workers** (:func:`get_redis`, :func:`make_redis`) ride it out: a command that cannot reach
  Redis (refused, reset, timed out) is retried with jittered exponential backoff for up to
  :data:`WORKER_OUTAGE_S` seconds, so a restart or a failover of a few seconds pauses the turns
  in flight instead of failing them (the lease, 30 s, outlasts the wait);
* **the gateway** (:func:`make_async_redis`) answers fast: short socket timeouts, so a frozen
  Redis gives 503 within about 2 s instead of hanging requests, one immediate retry on a
  reset connection, and a health check (PING) on any connection idle for a second, so stale
  pooled connections left by a restart are replaced before use instead of failing requests.

With Sentinel configured (:mod:`fermix_shared.sentinel`), :func:`client_for_settings` and
:func:`async_client_for_settings` build the same clients over a pool that asks the sentinels
for the master before each new connection: a failover is one more outage to the worker (its
retries reconnect to the promoted replica), and 503s to the gateway until the promotion.
Every Redis use that serves a configured deployment goes through these two.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel as sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

from fermix_shared.sentinel import (
    AsyncMasterConnection,
    MasterConnection,
    SentinelTarget,
    sentinel_target,
)
from fermix_shared.settings import Settings, get_settings

_lock = threading.Lock()
_sync: redis.Redis | None = None

# How long a worker's Redis command keeps retrying through an outage (seconds, roughly).
WORKER_OUTAGE_S = 20.0
_BACKOFF_BASE_S, _BACKOFF_CAP_S = 0.1, 2.0
# The gateway: a reply (or a connection) later than this is an outage, answered with 503.
GATEWAY_SOCKET_TIMEOUT_S = 2.0


def _retries_for(total_s: float) -> int:
    """How many retries the backoff needs to cover ``total_s`` seconds of outage."""
    waited, delay, n = 0.0, _BACKOFF_BASE_S, 0
    while waited < total_s:
        waited += delay
        delay = min(delay * 2, _BACKOFF_CAP_S)
        n += 1
    return n


def outage_retry(total_s: float = WORKER_OUTAGE_S) -> Retry:
    """Retry on connection trouble (and a Redis still loading its AOF) for ~``total_s``."""
    return Retry(
        ExponentialWithJitterBackoff(base=_BACKOFF_BASE_S, cap=_BACKOFF_CAP_S),
        _retries_for(total_s),
        supported_errors=(ConnectionError, TimeoutError, socket.timeout, BusyLoadingError),
    )


def pool_size() -> int:
    """Connections per process: the worker's concurrency plus headroom."""
    return get_settings().worker_concurrency + 100


class _BlockingSentinelPool(sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """The master's pool through Sentinel, waiting for a free connection like the direct one.
    A connection to a demoted master is dropped on release (``owns_connection``)."""


class _AsyncBlockingSentinelPool(aiosentinel.SentinelConnectionPool,
                                 aioredis.BlockingConnectionPool):
    """The gateway's blocking pool, through Sentinel."""


def _worker_pool_kwargs(max_connections: int, outage_s: float) -> dict[str, Any]:
    return {
        "max_connections": max_connections,
        "timeout": 30,
        "socket_timeout": 10,
        "socket_connect_timeout": 2,
        "health_check_interval": 5,
        "retry": outage_retry(outage_s),
        "decode_responses": True,
    }


def make_redis(url: str, max_connections: int = 200,
               outage_s: float = WORKER_OUTAGE_S) -> redis.Redis:
    """A worker-style client: waits for a pooled connection, rides out outages."""
    pool = redis.BlockingConnectionPool.from_url(url, **_worker_pool_kwargs(max_connections, outage_s))
    return redis.Redis(connection_pool=pool)


def make_sentinel_redis(target: SentinelTarget, max_connections: int = 200,
                        outage_s: float = WORKER_OUTAGE_S) -> redis.Redis:
    """:func:`make_redis` through Sentinel: a failover within ``outage_s`` is ridden out."""
    manager = sentinel.Sentinel(  # type: ignore[no-untyped-call]
        target.sentinels, sentinel_kwargs=target.sentinel_kwargs(), **target.connection_kwargs())
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        target.master, redis_class=redis.Redis, connection_pool_class=_BlockingSentinelPool,
        connection_class=MasterConnection, **_worker_pool_kwargs(max_connections, outage_s))
    return client


def client_for_settings(settings: Settings, max_connections: int = 200,
                        outage_s: float = WORKER_OUTAGE_S) -> redis.Redis:
    """A worker-style client of the deployment's Redis: through Sentinel when configured,
    else ``settings.redis_url``."""
    target = sentinel_target(settings)
    if target is None:
        return make_redis(settings.redis_url, max_connections, outage_s)
    return make_sentinel_redis(target, max_connections, outage_s)


def get_redis() -> redis.Redis:
    """The process-wide synchronous client (worker, CLI)."""
    global _sync
    if _sync is None:
        with _lock:
            if _sync is None:
                _sync = client_for_settings(get_settings(), max_connections=pool_size())
    return _sync


# A command line that cannot reach Redis says so within about this long (seconds).
CLI_OUTAGE_S = 2.0


def cli_redis() -> redis.Redis:
    """A client for one ``fermix`` command: a few connections, and an unreachable Redis is an
    error within ~2 s (a person is waiting), not the worker's 20 s of riding it out."""
    return client_for_settings(get_settings(), max_connections=10, outage_s=CLI_OUTAGE_S)


def _gateway_pool_kwargs() -> dict[str, Any]:
    return {
        "max_connections": 500,
        "timeout": GATEWAY_SOCKET_TIMEOUT_S,
        "socket_timeout": GATEWAY_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": 1,
        "health_check_interval": 1,
        "retry": AsyncRetry(NoBackoff(), 1, supported_errors=(ConnectionError,)),
        "decode_responses": True,
    }


def make_async_redis(url: str) -> aioredis.Redis:
    """A client for the gateway's event loop (one per app, closed on shutdown)."""
    pool = aioredis.BlockingConnectionPool.from_url(url, **_gateway_pool_kwargs())
    return aioredis.Redis(connection_pool=pool)


def make_async_sentinel_redis(target: SentinelTarget) -> aioredis.Redis:
    """:func:`make_async_redis` through Sentinel. While no sentinel names a healthy master
    (the old one is down, the new one not yet promoted) a request fails fast and is a 503."""
    manager = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
        target.sentinels, sentinel_kwargs=target.sentinel_kwargs(), **target.connection_kwargs())
    client: aioredis.Redis = manager.master_for(
        target.master, redis_class=aioredis.Redis,
        connection_pool_class=_AsyncBlockingSentinelPool, connection_class=AsyncMasterConnection,
        **_gateway_pool_kwargs())
    return client


def async_client_for_settings(settings: Settings) -> aioredis.Redis:
    """The gateway's client of the deployment's Redis: through Sentinel when configured."""
    target = sentinel_target(settings)
    if target is None:
        return make_async_redis(settings.redis_url)
    return make_async_sentinel_redis(target)
