"""``fermix doctor`` with Redis through Sentinel: one ``redis.sentinel`` line.

It asks every sentinel in ``FERMIX_REDIS_SENTINELS`` what it knows of the master named by
``FERMIX_REDIS_MASTER``: how many answer, where the master is, how many healthy replicas it
has. A failover needs a majority of the sentinels; the gateway refuses messages while the
master has fewer replicas than ``FERMIX_REDIS_WAIT_REPLICAS`` (fermix_shared/sentinel.py), so
a master with exactly that many is one replica loss away from refusing.

:func:`check_sentinels` is pure: facts in, a :class:`Check` out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fermix_cli.doctor.check import Check
from fermix_shared.sentinel import SentinelTarget, describe, sentinel_target
from fermix_shared.settings import Settings

TIMEOUT_S = 1.0


@dataclass(frozen=True)
class SentinelFacts:
    """``answered``: sentinels that answered out of ``asked``; ``knows``: of those, the ones
    that monitor the master; ``master``: its address by the first of them (None: none
    does, or it is down); ``replicas``: its replicas that are up; ``quorum``: its quorum."""

    asked: int
    answered: int
    knows: int
    master: str | None
    replicas: int
    quorum: int


def _flag_down(state: dict[str, Any]) -> bool:
    flags = str(state.get("flags", ""))
    return "s_down" in flags or "o_down" in flags or "disconnected" in flags


def read_sentinels(target: SentinelTarget) -> SentinelFacts:
    answered = knows = replicas = quorum = 0
    master: str | None = None
    for host, port in target.sentinels:
        s = redis.Redis(host, port, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S,
                        decode_responses=True, retry=Retry(NoBackoff(), 0))
        try:
            masters: dict[str, Any] = s.sentinel_masters()  # type: ignore[assignment]
            answered += 1
            state = masters.get(target.master)
            if not state:
                continue
            knows += 1
            if master is None and not _flag_down(state):
                master, quorum = f"{state['ip']}:{state['port']}", int(state.get("quorum", 0))
                known: list[dict[str, Any]] = s.sentinel_slaves(target.master)
                up = [r for r in known if not _flag_down(r)]
                replicas = len(up)
        except redis.RedisError:
            continue
        finally:
            s.close()
    return SentinelFacts(len(target.sentinels), answered, knows, master, replicas, quorum)


def check_sentinels(facts: SentinelFacts, name: str, wait_replicas: int) -> Check:
    fix_list = "correct FERMIX_REDIS_SENTINELS (host:port,...) or start the sentinels"
    if facts.answered == 0:
        return Check("redis.sentinel", "fail",
                     f"none of the {facts.asked} sentinel(s) answered within {TIMEOUT_S:g} s.",
                     fix_list)
    if facts.knows == 0 or facts.master is None:
        what = "monitors" if facts.knows == 0 else "sees a healthy"
        return Check("redis.sentinel", "fail",
                     f"no sentinel {what} master {name!r} ({facts.answered} of {facts.asked} "
                     "answered).",
                     "set FERMIX_REDIS_MASTER to the name in `sentinel monitor <name> ...`, or "
                     "wait for the failover to finish")
    said = (f"master {name!r} at {facts.master}, {facts.replicas} replica(s) up; "
            f"{facts.answered} of {facts.asked} sentinels answer (quorum {facts.quorum})")
    if facts.replicas < wait_replicas:
        return Check("redis.sentinel", "fail",
                     f"{said}: fewer replicas than FERMIX_REDIS_WAIT_REPLICAS={wait_replicas}, so "
                     "the gateway refuses every message (503).",
                     "start replicas, or lower FERMIX_REDIS_WAIT_REPLICAS")
    if facts.answered < facts.asked or facts.asked < 3:
        return Check("redis.sentinel", "warn",
                     f"{said}: a failover needs a majority of at least 3 sentinels that answer.",
                     fix_list if facts.answered < facts.asked else
                     "run 3 or more sentinels, on different hosts")
    if wait_replicas and facts.replicas == wait_replicas:
        return Check("redis.sentinel", "warn",
                     f"{said}: after a failover the new master has {wait_replicas - 1} and the "
                     "gateway refuses messages until another replica joins.",
                     f"run {wait_replicas + 1} or more replicas")
    return Check("redis.sentinel", "ok", f"{said}.")


def sentinel_checks(settings: Settings) -> list[Check]:
    """The ``redis.sentinel`` line, or none when Redis is reached directly."""
    target = sentinel_target(settings)
    if target is None:
        return []
    facts = read_sentinels(target)
    assert settings.redis_master is not None
    check = check_sentinels(facts, settings.redis_master, settings.wait_replicas())
    if check.level == "fail" and facts.answered == 0:
        return [Check(check.name, check.level, f"{describe(settings)}: {check.message}",
                      check.fix)]
    return [check]
