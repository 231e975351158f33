"""Redis through Sentinel: where the sentinels are, what every client is given, and the
durability wait at accept.

With ``FERMIX_REDIS_SENTINELS`` (``host:port,...``) and ``FERMIX_REDIS_MASTER`` (the master's
name) set, every Redis use asks the sentinels where the master is, and asks again after a
failover: the clients of :mod:`fermix_shared.redis_client`, the Celery broker, the result
backend and RedBeat (:mod:`fermix_shared.celery_app`). ``FERMIX_REDIS_URL`` then gives only the
database, the user and the password; its host and port are not used.

Replication is asynchronous: a message the primary acknowledged can vanish if the primary dies
before a replica has it. So the gateway, after the durable write of an inbound message and
before it answers, runs ``WAIT n timeout`` on the connection that wrote it
(:func:`write_session`, :func:`replication_shortfall`); fewer than ``n``
replicas acknowledging is :class:`NotReplicated`, answered 503 with ``Retry-After`` (the
platforms retry; the de-duplication key makes the retry safe). ``n`` is
``FERMIX_REDIS_WAIT_REPLICAS`` (unset: 1 with Sentinel, else 0: no WAIT and no extra round
trip) and the timeout ``FERMIX_REDIS_WAIT_TIMEOUT_MS`` (500). With ``n`` >= 1 the gateway
refuses messages while the master has fewer than ``n`` replicas: run at least ``n + 1``
replicas, so that a failover still leaves ``n``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel as sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

if TYPE_CHECKING:
    from fermix_shared.settings import Settings

DEFAULT_SENTINEL_PORT = 26379
# A sentinel that does not answer within this long is skipped for the next one (seconds).
SENTINEL_SOCKET_TIMEOUT_S = 0.5
# What a refused accept tells the platform to wait before it retries (seconds).
NOT_REPLICATED_RETRY_AFTER_S = 1

Address = tuple[str, int]
_NO_RETRY = AsyncRetry(NoBackoff(), 0)


def parse_sentinels(value: Any) -> list[Address]:
    """``host:port,host:port`` (or a list of such entries) as addresses; ``[::1]:26379`` for
    IPv6, the port defaults to 26379. A malformed entry is a ValueError that names it."""
    if not isinstance(value, (str, list, tuple)):
        raise ValueError("FERMIX_REDIS_SENTINELS: expected host:port,host:port")
    entries = value.split(",") if isinstance(value, str) else list(value)
    out: list[Address] = []
    for raw in entries:
        if isinstance(raw, (list, tuple)) and len(raw) == 2:
            raw = f"{raw[0]}:{raw[1]}"
        entry = str(raw).strip()
        if not entry:
            continue
        out.append(_address(entry))
    return out


def _address(entry: str) -> Address:
    bad = (f"FERMIX_REDIS_SENTINELS: {entry!r} is not host:port (for example "
           f"10.0.0.5:{DEFAULT_SENTINEL_PORT}, or [::1]:{DEFAULT_SENTINEL_PORT} for IPv6)")
    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(bad)
        port_text = rest[1:]
    else:
        host, _, port_text = entry.rpartition(":") if ":" in entry else (entry, "", "")
        if ":" in host:
            raise ValueError(bad + "; put an IPv6 address in brackets")
    if not host or "/" in host or " " in host:
        raise ValueError(bad)
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(bad)
    return host, int(port_text)


def check_pair(sentinels: list[Address], master: str | None) -> None:
    """Sentinels and a master name come together: a ValueError names the one missing."""
    if sentinels and not master:
        raise ValueError("FERMIX_REDIS_SENTINELS is set but FERMIX_REDIS_MASTER is not: "
                         "name the master the sentinels watch (`sentinel monitor <name>`)")
    if master and not sentinels:
        raise ValueError("FERMIX_REDIS_MASTER is set but FERMIX_REDIS_SENTINELS is not: "
                         "list the sentinels as host:port,host:port")


@dataclass(frozen=True)
class SentinelTarget:
    """A master found through sentinels, and what to log in as on it."""

    sentinels: list[Address]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def connection_kwargs(self) -> dict[str, Any]:
        """The master's database and credentials, as redis-py keywords."""
        kw: dict[str, Any] = {"db": self.db}
        if self.username:
            kw["username"] = self.username
        if self.password:
            kw["password"] = self.password
        return kw

    def sentinel_kwargs(self, timeout_s: float = SENTINEL_SOCKET_TIMEOUT_S) -> dict[str, Any]:
        """How a client talks to the sentinels themselves (no password: see the README)."""
        return {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}

    def kombu_url(self) -> str:
        """kombu's and Celery's form: ``sentinel://:pw@h1:p1/db;sentinel://:pw@h2:p2/db``."""
        auth = ""
        if self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        elif self.username:
            auth = f"{quote(self.username, safe='')}@"
        return ";".join(f"sentinel://{auth}{_hostport(h, p)}/{self.db}" for h, p in self.sentinels)

    def transport_options(self) -> dict[str, Any]:
        """kombu and the Celery result backend: the master's name and sentinel timeouts."""
        return {"master_name": self.master, "sentinel_kwargs": self.sentinel_kwargs()}

    def redbeat_options(self) -> dict[str, Any]:
        """``redbeat_redis_options`` for a ``redis-sentinel://`` RedBeat URL (the keys its
        ``get_redis`` reads: sentinels, service_name, db, password, username)."""
        opts: dict[str, Any] = {
            "sentinels": list(self.sentinels), "service_name": self.master, "db": self.db,
            "socket_timeout": 10, "sentinel_kwargs": self.sentinel_kwargs(),
            # RedBeat retries a command through a failover for this long (seconds).
            "retry_period": 20,
        }
        if self.password:
            opts["password"] = self.password
        if self.username:
            opts["username"] = self.username
        return opts


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MasterConnection(sentinel.SentinelManagedConnection):
    """A connection to the master that reconnects through the sentinels.

    redis-py 8 reconnects a dropped connection, on its next command, at the address it last
    had (``send_packed_command`` calls ``connect_check_health``, not ``connect``): after a
    failover that is the dead master, tried for the client's whole retry budget (20 s in a
    worker) while the promoted replica is ready. Here every reconnection asks the sentinels;
    ``connect_to`` (an address they just gave) connects as before.
    """

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        if self._sock:
            return
        if retry_socket_connect:
            self.connect()  # type: ignore[no-untyped-call]
            return
        super().connect_check_health(check_health=check_health, retry_socket_connect=False)


class AsyncMasterConnection(aiosentinel.SentinelManagedConnection):
    """:class:`MasterConnection` for the gateway's asyncio client."""

    async def connect_check_health(self, check_health: bool = True,
                                   retry_socket_connect: bool = True) -> None:
        if self._reader:
            return
        if retry_socket_connect:
            await self.connect()  # type: ignore[no-untyped-call]
            return
        await super().connect_check_health(check_health=check_health,
                                           retry_socket_connect=False)


def sentinel_target(settings: Settings) -> SentinelTarget | None:
    """The Sentinel set-up the settings name, or None when Redis is reached directly."""
    if not settings.redis_sentinels or not settings.redis_master:
        return None
    parts = urlsplit(settings.redis_url)
    db_text = parts.path.strip("/") or "0"
    return SentinelTarget(
        sentinels=list(settings.redis_sentinels), master=settings.redis_master,
        db=int(db_text) if db_text.isdigit() else 0,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def describe(settings: Settings) -> str:
    """Where Redis is, for messages: ``master 'x' via h:p,h:p (db 0)`` or ``host:port/db``."""
    target = sentinel_target(settings)
    if target is None:
        parts = urlsplit(settings.redis_url)
        return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"
    where = ",".join(_hostport(h, p) for h, p in target.sentinels)
    return f"master {target.master!r} via {where} (db {target.db})"


class NotReplicated(RedisError):
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
