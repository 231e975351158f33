"""Redis through Sentinel: where the sentinels are and what every client is given.

With ``FERMIX_REDIS_SENTINELS`` (``host:port,...``) and ``FERMIX_REDIS_MASTER`` (the master's
name) set, every Redis use asks the sentinels where the master is, and asks again after a
failover: the clients of :mod:`fermix_shared.redis.client`, the Celery broker, the result
backend and RedBeat (:mod:`fermix_shared.celery_app`). ``FERMIX_REDIS_URL`` then gives only the
database, the user and the password; its host and port are not used. What is waited for on
replicas (at accept, before a platform send) is :mod:`fermix_shared.redis.durability`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

import redis.asyncio.sentinel as aiosentinel
import redis.sentinel as sentinel

if TYPE_CHECKING:
    from fermix_shared.settings import Settings

DEFAULT_SENTINEL_PORT = 26379
# A sentinel that does not answer within this long is skipped for the next one (seconds).
SENTINEL_SOCKET_TIMEOUT_S = 0.5

Address = tuple[str, int]


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
        """How a client talks to the sentinels themselves (no password: see docs/operations/redis-sentinel.md)."""
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
