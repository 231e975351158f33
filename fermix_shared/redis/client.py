"""Redis clients, created lazily under a lock (many greenlets start at once).

redis-py raises at once when a plain pool is full; a BlockingConnectionPool waits for a free
connection instead, which is what a worker with hundreds of concurrent turns needs.

The two kinds of client treat an outage differently, on purpose:

* **workers** (:func:`get_redis`, :func:`make_redis`) ride it out: a command that cannot reach
  Redis (refused, reset, timed out) is retried with jittered exponential backoff for up to
  :data:`WORKER_OUTAGE_S` seconds, so a restart or a failover of a few seconds pauses the turns
  in flight instead of failing them (the lease, 30 s, outlasts the wait);
* **the gateway** (:func:`make_async_redis`) answers fast: short socket timeouts, so a frozen
  Redis gives 503 within about 2 s instead of hanging requests, and a health check (PING) on
  any connection idle for a second, so stale pooled connections left by a restart are
  replaced before use instead of failing requests. A command that meets a dropped
  connection is retried once, at once, on a fresh one, when repeating it is harmless
  (:data:`REPEATABLE`: the reads the gateway makes, and a plain ``SET``); a connection
  that could not be made (refused, or timed out connecting: nothing was sent) is retried
  for every command. Any other command whose reply was lost (the scripts that accept a
  message, ``XADD``, ``INCR``...: it may have run) is not sent again but raises
  :class:`ReplyLost`, a 503: the client's retry with the same message id is then answered
  as a duplicate. ``WAIT`` is never retried (:func:`fermix_shared.redis.durability.replication_shortfall`).

With Sentinel configured (:mod:`fermix_shared.redis.sentinel`), :func:`client_for_settings` and
:func:`async_client_for_settings` build the same clients over a pool that asks the sentinels
for the master before each new connection: a failover is one more outage to the worker (its
retries reconnect to the promoted replica), and 503s to the gateway until the promotion.
Every Redis use that serves a configured deployment goes through these two.
"""

from __future__ import annotations

import builtins
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

from fermix_shared.errors import FermixError
from fermix_shared.redis.sentinel import (
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


def _expected_delay(failures: int) -> float:
    """The mean pause before retry ``failures`` (1, 2, ...) of redis-py's
    ExponentialWithJitterBackoff: ``min(cap, U * base * 2**failures)``, U uniform on [0, 1)."""
    x = float(_BACKOFF_BASE_S * 2 ** failures)
    return x / 2 if x <= _BACKOFF_CAP_S else _BACKOFF_CAP_S - _BACKOFF_CAP_S ** 2 / (2 * x)


def _retries_for(total_s: float) -> int:
    """How many retries ride out about ``total_s`` seconds of outage: the count whose mean
    total pause is nearest it (20 s: 14 retries, 20.3 s; the CLI's 2 s: 4, 1.5 s, where 5
    took 2.9 s on average); none for 0."""
    if total_s <= 0:
        return 0
    waited, n = 0.0, 0
    while True:
        step = _expected_delay(n + 1)
        if abs(waited + step - total_s) >= abs(waited - total_s) and n > 0:
            return n
        waited += step
        n += 1


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


# Commands the gateway may send again after a dropped connection: reads, and a SET without
# options (it stores the same value again). Not a script (every Fermix script writes; the
# accept's de-dup mark makes a repeat safe only when the message has an id), XADD (a second
# event), INCR or SET NX (a second count, a "not first" answer), nor WAIT (see above).
REPEATABLE = frozenset({
    "GET", "MGET", "EXISTS", "TTL", "PTTL", "TYPE", "HGET", "HGETALL", "HMGET", "HLEN",
    "HEXISTS", "HKEYS", "HVALS", "HSCAN", "LRANGE", "LLEN", "LINDEX", "SMEMBERS", "SISMEMBER",
    "SCARD", "SSCAN", "ZCARD", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE",
    "ZREVRANGEBYSCORE", "ZSCORE", "ZMSCORE", "ZRANK", "ZSCAN", "XRANGE", "XREVRANGE", "XLEN",
    "XREAD", "XINFO", "SCAN", "PING", "INFO", "ROLE", "EVALSHA_RO", "EVAL_RO", "SCRIPT",
    # A transaction's frame: what runs inside it decides (a MULTI of reads is a read).
    "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH",
})
# Sent by callers that handle a dropped connection themselves (no retry: the caller decides).
_CALLER_DECIDES = frozenset({"WAIT", "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE",
                             "PUNSUBSCRIBE", "SUNSUBSCRIBE"})


def repeatable(args: tuple[Any, ...]) -> bool:
    """Whether the command ``args`` may be sent again after its reply was lost."""
    name = str(args[0]).upper() if args else ""
    if name == "SET":
        return len(args) == 3 or (len(args) == 5 and str(args[3]).upper() in ("EX", "PX"))
    return name in REPEATABLE or name in _CALLER_DECIDES


class ReplyLost(FermixError, ConnectionError):
    """The connection dropped after a command that must not run twice was sent: it may have
    run. A ConnectionError to every caller (the gateway answers 503, storage unavailable, try
    again), but one :class:`_GatewayRetry` never retries."""


class _GatewayRetry(AsyncRetry):
    """redis-py's Retry, but never for :class:`ReplyLost`."""

    async def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                              with_failure_count: bool = False) -> Any:
        def retryable(error: Exception) -> bool:
            if isinstance(error, ReplyLost):
                return False
            return is_retryable is None or bool(is_retryable(error))

        return await super().call_with_retry(do, fail, retryable, with_failure_count)


class _GatewayConnectionMixin:
    """What the gateway's Retry (one immediate retry on ConnectionError) may repeat.

    A socket that times out while connecting is a ConnectionError (nothing was sent: retried
    like a refused connection; redis-py would raise TimeoutError, not retried);
    a dropped connection while reading the reply of a command outside :func:`repeatable`
    raises :class:`ReplyLost` (not retried, :class:`_GatewayRetry`). Pipelines count as
    repeatable only when every command in them is. Before such a command a pooled connection
    is checked for a close Redis already sent (a restart): it is replaced, not written to.
    """

    _next_repeatable = False
    _reply_repeatable = True

    async def _connect(self) -> None:
        self._reply_repeatable = True  # the handshake's replies
        try:
            await super()._connect()  # type: ignore[misc]
        except builtins.TimeoutError as e:  # redis-py makes it a TimeoutError: not retried
            where = self._host_error()  # type: ignore[attr-defined]
            raise ConnectionError(f"timed out connecting to {where} (nothing was sent)") from e

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("check_health", True):  # not a health check's PING nor the handshake
            self._next_repeatable = repeatable(args)
        await super().send_command(*args, **kwargs)  # type: ignore[misc]

    def pack_commands(self, commands: Any) -> list[bytes]:
        commands = list(commands)
        self._next_repeatable = all(repeatable(tuple(c)) for c in commands)
        packed: list[bytes] = super().pack_commands(commands)  # type: ignore[misc]
        return packed

    def _peer_closed(self) -> bool:
        """Whether Redis has already closed this socket (its FIN or RST is in the kernel, not
        yet seen by the event loop): one non-blocking peek, no round trip."""
        writer = getattr(self, "_writer", None)
        sock = writer.transport.get_extra_info("socket") if writer is not None else None
        if sock is None:
            return False
        probe = socket.socket(fileno=sock.fileno())
        try:
            return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            probe.detach()

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        after = self._next_repeatable
        if check_health and not after and self.is_connected and self._peer_closed():  # type: ignore[attr-defined]
            # A pooled connection Redis closed (a restart): the command would be lost on
            # it, and not sent again. Reconnect first; nothing was sent yet.
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
        self._reply_repeatable = True  # a health check's PONG may come first
        await super().send_packed_command(command, check_health)  # type: ignore[misc]
        if check_health:  # a command of the caller's (unknown next time: not repeatable)
            self._reply_repeatable, self._next_repeatable = after, False

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ConnectionError as e:
            if self._reply_repeatable:
                raise
            raise ReplyLost(f"{e} (after a command that may have run: not sent again)") from e


class _GatewayConnection(_GatewayConnectionMixin, aioredis.Connection):
    """The gateway's connection to Redis (:class:`_GatewayConnectionMixin`)."""


class _GatewayMasterConnection(_GatewayConnectionMixin, AsyncMasterConnection):
    """The gateway's connection to the master through Sentinel."""


def _gateway_pool_kwargs() -> dict[str, Any]:
    return {
        "max_connections": 500,
        "timeout": GATEWAY_SOCKET_TIMEOUT_S,
        "socket_timeout": GATEWAY_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": 1,
        "health_check_interval": 1,
        "retry": _GatewayRetry(NoBackoff(), 1, supported_errors=(ConnectionError,)),
        "decode_responses": True,
    }


def make_async_redis(url: str) -> aioredis.Redis:
    """A client for the gateway's event loop (one per app, closed on shutdown)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, connection_class=_GatewayConnection, **_gateway_pool_kwargs())
    return aioredis.Redis(connection_pool=pool)


def make_async_sentinel_redis(target: SentinelTarget) -> aioredis.Redis:
    """:func:`make_async_redis` through Sentinel. While no sentinel names a healthy master
    (the old one is down, the new one not yet promoted) a request fails fast and is a 503."""
    manager = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
        target.sentinels, sentinel_kwargs=target.sentinel_kwargs(), **target.connection_kwargs())
    client: aioredis.Redis = manager.master_for(
        target.master, redis_class=aioredis.Redis,
        connection_pool_class=_AsyncBlockingSentinelPool,
        connection_class=_GatewayMasterConnection, **_gateway_pool_kwargs())
    return client


def async_client_for_settings(settings: Settings) -> aioredis.Redis:
    """The gateway's client of the deployment's Redis: through Sentinel when configured."""
    target = sentinel_target(settings)
    if target is None:
        return make_async_redis(settings.redis_url)
    return make_async_sentinel_redis(target)
