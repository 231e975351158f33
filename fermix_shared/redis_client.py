"""Redis clients, created lazily under a lock (many greenlets start at once).

redis-py raises at once when a plain pool is full; a BlockingConnectionPool waits for a free
connection instead, which is what a worker with hundreds of concurrent turns needs.
"""

from __future__ import annotations

import threading

import redis
import redis.asyncio as aioredis

from fermix_shared.settings import get_settings

_lock = threading.Lock()
_sync: redis.Redis | None = None


def pool_size() -> int:
    """Connections per process: the worker's concurrency plus headroom."""
    return get_settings().worker_concurrency + 100


def get_redis() -> redis.Redis:
    """The process-wide synchronous client (worker, CLI)."""
    global _sync
    if _sync is None:
        with _lock:
            if _sync is None:
                pool = redis.BlockingConnectionPool.from_url(
                    get_settings().redis_url,
                    max_connections=pool_size(),
                    timeout=30,
                    socket_timeout=30,
                    socket_connect_timeout=5,
                    health_check_interval=30,
                    decode_responses=True,
                )
                _sync = redis.Redis(connection_pool=pool)
    return _sync


def make_async_redis(url: str) -> aioredis.Redis:
    """A client for the gateway's event loop (one per app, closed on shutdown)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=500,
        timeout=30,
        socket_timeout=30,
        socket_connect_timeout=5,
        health_check_interval=30,
        decode_responses=True,
    )
    return aioredis.Redis(connection_pool=pool)
