"""``fermix doctor`` with Redis through Sentinel: a ``redis.sentinel`` line, and with a
durability wait a ``redis.replicas`` line.

``redis.sentinel`` asks every sentinel in ``FERMIX_REDIS_SENTINELS`` what it knows of the
master named by ``FERMIX_REDIS_MASTER``: how many answer, where the master is, how many healthy
replicas it has. A failover needs a majority of the sentinels. With a strict
``FERMIX_REDIS_WAIT_REPLICAS=N`` the gateway refuses messages while the master has fewer than
``N`` replicas, so a master with exactly ``N`` is one loss away from refusing; under ``auto``
it then accepts them unreplicated (fermix_shared/redis/replicas.py).

``redis.replicas`` asks the master itself (``ROLE``) how many replicas are connected, and says
what the rule makes of that: waited for, accepted unreplicated (``auto``, warn) or refused
(strict, fail).

:func:`check_sentinels` and :func:`check_replicas` are pure: facts in, a :class:`Check` out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from fermix_cli.doctor.check import Check
from fermix_shared.redis.replicas import WaitRule, connected_replicas, wait_rule
from fermix_shared.redis.sentinel import SentinelTarget, describe, sentinel_target
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


def check_sentinels(facts: SentinelFacts, name: str, wait_replicas: int,
                    strict: bool = True) -> Check:
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
    if not strict and wait_replicas and facts.replicas <= wait_replicas:
        now = ("has no replica: messages are accepted unreplicated (FERMIX_REDIS_WAIT_REPLICAS="
               "auto)" if facts.replicas == 0 else "after a failover the new master has none, "
               "and messages are accepted unreplicated (auto) until a replica joins")
        return Check("redis.sentinel", "warn", f"{said}: {now}.",
                     f"run {wait_replicas + 1} or more replicas")
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
    rule = wait_rule(settings)
    check = check_sentinels(facts, settings.redis_master, rule.replicas, rule.strict)
    if check.level == "fail" and facts.answered == 0:
        return [Check(check.name, check.level, f"{describe(settings)}: {check.message}",
                      check.fix)]
    return [check]


def check_replicas(connected: int | None, rule: WaitRule) -> Check:
    """The ``redis.replicas`` line: ``connected`` replicas the master streams to (None: it
    did not answer) under the ``FERMIX_REDIS_WAIT_REPLICAS`` rule."""
    said = f"FERMIX_REDIS_WAIT_REPLICAS={rule.label}"
    if connected is None:
        return Check("redis.replicas", "fail", f"the master did not answer ROLE ({said}).",
                     "see the redis lines")
    has = f"the master has {connected} connected replica(s)"
    if connected >= rule.replicas:
        return Check("redis.replicas", "ok",
                     f"{has}; each accepted message waits for {rule.replicas} ({said}).")
    if not rule.strict:
        return Check("redis.replicas", "warn",
                     f"{has}: messages are accepted unreplicated ({said}), so a loss of this "
                     "primary loses the ones it has not streamed yet; counted in "
                     "fermix_unreplicated_accepts_total.",
                     "start a replica (replicaof the master)")
    return Check("redis.replicas", "fail",
                 f"{has}, fewer than {said}: the gateway answers every message 503.",
                 f"start replicas, or set FERMIX_REDIS_WAIT_REPLICAS=auto or a number <= "
                 f"{connected}")


def read_connected(settings: Settings) -> int | None:
    """The master's connected replicas (``ROLE``), through the sentinels when configured;
    None when it does not answer within :data:`TIMEOUT_S`."""
    quick: dict[str, Any] = {"socket_connect_timeout": TIMEOUT_S, "socket_timeout": TIMEOUT_S,
                             "retry": Retry(NoBackoff(), 0)}
    target = sentinel_target(settings)
    if target is None:
        r = redis.Redis.from_url(settings.redis_url, **quick)
    else:
        found = Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels, sentinel_kwargs=target.sentinel_kwargs(TIMEOUT_S))
        r = found.master_for(  # type: ignore[no-untyped-call]
            target.master, **quick, **target.connection_kwargs())
    try:
        return connected_replicas(r.role())
    except redis.RedisError:
        return None
    finally:
        r.close()


def replica_checks(settings: Settings) -> list[Check]:
    """The ``redis.replicas`` line, or none when nothing waits (``FERMIX_REDIS_WAIT_REPLICAS``
    0, the default without Sentinel)."""
    rule = wait_rule(settings)
    if rule.replicas == 0:
        return []
    return [check_replicas(read_connected(settings), rule)]
