"""``fermix doctor``: Redis and the fleet seen through it.

Redis holds every accepted message until its turn runs, so it must keep what it acknowledged:
AOF on (``appendonly yes``, ``appendfsync everysec``) and ``maxmemory-policy noeviction``
(any other policy deletes keys, accepted messages included, once memory is full). Through
Redis we also see the workers (their heartbeats), beat (RedBeat's lock, renewed every tick)
and the hosts' clocks: each heartbeat carries the worker's own time and Redis server time,
written in one script (``fermix_shared/lua/beat.lua``), so their difference is that host's
clock skew; this host's is its clock against Redis ``TIME``.

The ``check_*`` functions are pure: facts in, a :class:`Check` out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from fermix_cli.doctor.check import Check, clip, scrub
from fermix_shared import keys
from fermix_shared.redis.sentinel import describe, sentinel_target
from fermix_shared.settings import Settings

CONNECT_TIMEOUT_S = 2.0
MIN_VERSION = (6, 2)
# RedBeat's lock key: its default, ``redbeat_key_prefix`` ("redbeat:") + ":lock"; the Celery
# app (fermix_shared/celery_app.py) keeps both defaults.
REDBEAT_LOCK_KEY = "redbeat::lock"
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 30.0
_NTP_FIX = "run NTP on every host (chrony or systemd-timesyncd) and check `timedatectl`"


@dataclass(frozen=True)
class RedisFacts:
    """What Redis says of itself. ``appendfsync`` and ``save`` are None when CONFIG is
    refused (managed Redis often disables it); INFO always answers the rest."""

    version: str
    aof_enabled: bool
    appendfsync: str | None
    save: str | None
    maxmemory_policy: str
    maxmemory: int


@dataclass(frozen=True)
class FleetFacts:
    """Heartbeats and locks, with Redis server time.

    ``beats``: worker process -> last heartbeat (ms, Redis time; 0 once it stopped);
    ``seen``: Celery node -> the worker's own clock at its last heartbeat (unix seconds);
    ``host_skew_s``: this host's clock minus Redis's; ``beat_lock_ttl_ms``: PTTL of RedBeat's
    lock (-2 when nobody holds it).
    """

    redis_now_ms: int
    host_skew_s: float
    beats: Mapping[str, int]
    seen: Mapping[str, float]
    beat_lock_ttl_ms: int


def where(url: str) -> str:
    """The Redis URL without its password: ``host:port/db``."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path or url
    db = parts.path.strip("/") or "0"
    return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}/{db}"


def connect(settings: Settings) -> redis.Redis:
    """A client of the deployment's Redis (through Sentinel when configured) that gives up
    within ~2 s: no retries, short timeouts."""
    opts: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT_S,
                            "socket_timeout": CONNECT_TIMEOUT_S, "decode_responses": True,
                            "retry": Retry(NoBackoff(), 0)}
    target = sentinel_target(settings)
    if target is None:
        return redis.Redis.from_url(settings.redis_url, **opts)
    manager = Sentinel(  # type: ignore[no-untyped-call]
        target.sentinels, sentinel_kwargs=target.sentinel_kwargs(CONNECT_TIMEOUT_S / 2),
        **target.connection_kwargs())
    client: redis.Redis = manager.master_for(target.master, **opts)  # type: ignore[no-untyped-call]
    return client


def read_redis(r: redis.Redis) -> RedisFacts:
    info = r.info()
    try:
        fsync = r.config_get("appendfsync").get("appendfsync")
        save = r.config_get("save").get("save")
    except redis.ResponseError:  # CONFIG renamed or disabled
        fsync = save = None
    return RedisFacts(version=str(info.get("redis_version", "?")),
                      aof_enabled=bool(int(info.get("aof_enabled", 0))),
                      appendfsync=fsync, save=save,
                      maxmemory_policy=str(info.get("maxmemory_policy", "?")),
                      maxmemory=int(info.get("maxmemory", 0)))


def read_fleet(r: redis.Redis) -> FleetFacts:
    before = time.time()
    seconds, micros = r.time()
    after = time.time()
    redis_now = seconds + micros / 1e6
    pipe = r.pipeline(transaction=True)
    pipe.hgetall(keys.worker_beats())
    pipe.hgetall(keys.workers())
    pipe.pttl(REDBEAT_LOCK_KEY)
    beats_raw, seen_raw, ttl = pipe.execute()
    return FleetFacts(
        redis_now_ms=int(redis_now * 1000),
        host_skew_s=(before + after) / 2 - redis_now,
        beats={k: int(float(v)) for k, v in beats_raw.items() if _number(v)},
        seen={k: float(v) for k, v in seen_raw.items() if _number(v)},
        beat_lock_ttl_ms=int(ttl),
    )


def _number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def check_version(version: str) -> Check:
    try:
        parsed = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        parsed = ()
    if len(parsed) == 2 and parsed >= MIN_VERSION:
        return Check("redis.version", "ok", f"Redis {version} (6.2 or later).")
    return Check("redis.version", "warn",
                 f"Redis {version} is older than 6.2, the oldest Fermix is tested against.",
                 "upgrade Redis to 6.2 or later (7.x recommended)")


def check_persistence(aof_enabled: bool, save: str | None) -> Check:
    if aof_enabled:
        return Check("redis.persistence", "ok",
                     "AOF is on (appendonly yes): accepted messages survive a restart.")
    fix = ("redis-cli CONFIG SET appendonly yes (at once), and `appendonly yes` in redis.conf "
           "(or CONFIG REWRITE) so a restart keeps it")
    if save:
        return Check("redis.persistence", "warn",
                     f"AOF is off; only RDB snapshots (save {save}) persist data: a crash "
                     "loses every message accepted since the last snapshot.", fix)
    return Check("redis.persistence", "fail",
                 "AOF is off and no RDB snapshots are configured: a Redis restart loses every "
                 "queued message, schedule and conversation.", fix)


def check_fsync(appendfsync: str | None) -> Check:
    if appendfsync == "everysec":
        return Check("redis.fsync", "ok",
                     "appendfsync everysec: a power cut loses at most ~1 s of writes.")
    if appendfsync == "always":
        return Check("redis.fsync", "ok",
                     "appendfsync always: every write is on disk before Redis answers.")
    fix = ("redis-cli CONFIG SET appendfsync everysec, and `appendfsync everysec` in "
           "redis.conf")
    if appendfsync is None:
        return Check("redis.fsync", "warn",
                     "appendfsync cannot be read (CONFIG is disabled on this Redis).",
                     "ask your Redis provider whether AOF is fsynced every second")
    return Check("redis.fsync", "warn",
                 f"appendfsync {appendfsync}: the OS flushes the AOF when it likes (~30 s on "
                 "Linux), so a power cut can lose that much.", fix)


def check_eviction(policy: str, maxmemory: int) -> Check:
    if policy == "noeviction":
        return Check("redis.eviction", "ok", "maxmemory-policy noeviction: a full Redis "
                     "refuses writes instead of deleting data.")
    limit = (f"maxmemory is {maxmemory} bytes" if maxmemory
             else "maxmemory is unset now, but a limit set later applies this policy")
    return Check("redis.eviction", "fail",
                 f"maxmemory-policy is {policy}: when memory is full Redis silently deletes "
                 f"keys, accepted messages and leases included ({limit}).",
                 "redis-cli CONFIG SET maxmemory-policy noeviction, and `maxmemory-policy "
                 "noeviction` in redis.conf")


def _node(process: str) -> str:
    """The Celery node of a worker process name (``node:pid:nonce``)."""
    return process.rsplit(":", 2)[0]


def _names(nodes: list[str]) -> str:
    shown = ", ".join(sorted(set(nodes))[:8])
    return shown + (", ..." if len(set(nodes)) > 8 else "")


def check_workers(beats: Mapping[str, int], now_ms: int, dead_s: float) -> Check:
    """Live: a heartbeat within ``dead_s`` (the reaper's threshold); silent: within
    ``keys.WORKER_SEEN_TTL_SECONDS`` but older than that (the reaper takes its turns)."""
    ages = {p: (now_ms - b) / 1000 for p, b in beats.items() if b > 0}
    live = [_node(p) for p, age in ages.items() if age <= dead_s]
    silent = [_node(p) for p, age in ages.items()
              if dead_s < age <= keys.WORKER_SEEN_TTL_SECONDS]
    if not live:
        return Check("workers", "warn",
                     f"no worker has sent a heartbeat in the last {dead_s:g} s: messages are "
                     "accepted but no turn runs.",
                     "start `fermix worker` (one process per core) against this Redis")
    n = len(set(live))
    message = f"{n} worker{'' if n == 1 else 's'} alive: {_names(live)}."
    if silent:
        return Check("workers", "warn",
                     f"{message[:-1]}; silent for over {dead_s:g} s: {_names(silent)} (their "
                     "turns resume elsewhere).",
                     "look at the silent workers' logs and hosts, or ignore it if you stopped "
                     "them")
    return Check("workers", "ok", message)


def check_beat(lock_ttl_ms: int) -> Check:
    if lock_ttl_ms > 0 or lock_ttl_ms == -1:
        return Check("beat", "ok", "a beat holds RedBeat's lock (renewed every tick): "
                     "scheduled jobs fire.")
    return Check("beat", "warn",
                 "no beat holds RedBeat's lock: scheduled jobs do not fire.",
                 "run `fermix beat` (two or more for failover) against this Redis")


def worker_skews(beats: Mapping[str, int], seen: Mapping[str, float], now_ms: int
                 ) -> dict[str, float]:
    """Each node's clock minus Redis's at its last heartbeat, for nodes that beat within
    ``keys.WORKER_SEEN_TTL_SECONDS``. Both times of a node come from one script call, so its
    newest beat is the one its ``seen`` was written with."""
    newest: dict[str, int] = {}
    for process, beat in beats.items():
        node = _node(process)
        if beat > newest.get(node, 0):
            newest[node] = beat
    return {node: seen[node] - beat / 1000 for node, beat in newest.items()
            if node in seen and now_ms - beat <= keys.WORKER_SEEN_TTL_SECONDS * 1000}


def check_clocks(host_skew_s: float, skews: Mapping[str, float]) -> Check:
    every = {"this host": host_skew_s, **skews}
    name, skew = max(every.items(), key=lambda kv: abs(kv[1]))
    side = "ahead of" if skew > 0 else "behind"
    what = f"{name}'s clock is {abs(skew):.1f} s {side} Redis's"
    if abs(skew) > SKEW_FAIL_S:
        return Check("clock", "fail", f"{what}: leases (30 s) and heartbeats are judged on "
                     "clocks that disagree by more than a lease.", _NTP_FIX)
    if abs(skew) > SKEW_WARN_S:
        return Check("clock", "warn", f"{what} (more than {SKEW_WARN_S:g} s): deadlines and "
                     "status ages are off by that much.", _NTP_FIX)
    n = len(skews)
    hosts = f"this host and {n} worker{'' if n == 1 else 's'}" if n else "this host; no worker seen"
    return Check("clock", "ok",
                 f"clocks agree with Redis within {max(abs(skew), 0.01):.2f} s ({hosts}).")


def _said(e: redis.RedisError, url: str) -> str:
    return clip(scrub(str(e), [urlsplit(url).password])).rstrip(".")


def redis_checks(settings: Settings) -> list[Check]:
    """Reachability, version, persistence and eviction; then workers, beat and clocks."""
    at = describe(settings) if sentinel_target(settings) else where(settings.redis_url)
    r = connect(settings)
    try:
        started = time.monotonic()
        facts = read_redis(r)
        ms = (time.monotonic() - started) * 1000
        fleet = read_fleet(r)
    except redis.AuthenticationError:
        return [Check("redis", "fail", f"Redis at {at} refused the credentials.",
                      "check the user and password in FERMIX_REDIS_URL "
                      "(redis://user:password@host:port/db)")]
    except (redis.ConnectionError, redis.TimeoutError) as e:
        return [Check("redis", "fail",
                      f"cannot reach Redis at {at} within {CONNECT_TIMEOUT_S:g} s: "
                      f"{_said(e, settings.redis_url)}; the checks that read Redis were skipped.",
                      "start Redis, or correct FERMIX_REDIS_URL")]
    except redis.RedisError as e:  # an ACL that forbids a command, a replica still loading
        return [Check("redis", "fail",
                      f"Redis at {at} refused the doctor's reads: {_said(e, settings.redis_url)}; "
                      "the checks that read Redis were skipped.",
                      "let FERMIX_REDIS_URL's user run INFO, CONFIG GET, TIME, HGETALL and PTTL, "
                      "or run the doctor as one who can")]
    finally:
        r.close()
    dead_s = max(settings.worker_dead_seconds, 3 * settings.worker_heartbeat_seconds)
    checks = [
        Check("redis", "ok", f"Redis at {at} answers ({ms:.0f} ms)."),
        check_version(facts.version),
        check_persistence(facts.aof_enabled, facts.save),
    ]
    if facts.aof_enabled:
        checks.append(check_fsync(facts.appendfsync))
    checks += [
        check_eviction(facts.maxmemory_policy, facts.maxmemory),
        check_workers(fleet.beats, fleet.redis_now_ms, dead_s),
        check_beat(fleet.beat_lock_ttl_ms),
        check_clocks(fleet.host_skew_s, worker_skews(fleet.beats, fleet.seen, fleet.redis_now_ms)),
    ]
    return checks
