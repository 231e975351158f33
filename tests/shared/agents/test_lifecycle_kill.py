"""Killing an agent, in Redis: the kill is recorded against the definition (re-creating the
agent, i.e. declaring it again with a change, lifts it; an upgrade that adds a field does not),
its running turns are cancelled (and only its own: not another agent's, not a compaction), its
pause ends and what the pause held is released, and the status says ``killed``. Scratch Redis,
no workers (tests/worker/test_kill_fleet.py stops real turns)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.agents import lifecycle as agents
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.stores import queue
from fermix_shared.stores.status import AgentActivity, queue_status
from tests.shared.agents.test_lifecycle import conv_key, send

T = TypeVar("T")
LEASE_S = 30.0
NOW_MS = 1_700_000_000_000
OPS = AgentDefinition(name="ops", model="m-ops", system_prompt="You are Ops.")


def running(r: redis.Redis, text: str, agent: str, **extra: object) -> str:
    """A conversation whose active turn is ``text`` for ``agent``."""
    key = conv_key()
    send(r, key, text, agent, **extra)
    claim, lease = queue.claim(r, key.as_str(), "w1", LEASE_S)
    assert claim.kind == "claimed" and lease is not None
    return key.as_str()


def on(url: str, call: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    async def go() -> T:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            return await call(client)
        finally:
            await client.aclose()
    return asyncio.run(go())


def test_a_kill_stands_until_the_definition_is_re_created() -> None:
    kill = agents.Kill(NOW_MS, OPS.fingerprint)
    assert kill.stands(OPS)
    # The same definition, a default spelled out, or an undeclared agent: still killed.
    assert kill.stands(OPS.model_copy(update={"stream_thinking": False}))
    assert kill.stands(AgentDefinition(name="ops", model="m-ops", system_prompt="You are Ops.",
                                       role="main", trust="operator"))
    assert kill.stands(None)
    # Declared again with a change: a new agent.
    assert not kill.stands(OPS.model_copy(update={"system_prompt": "You are Ops, v2."}))
    assert not kill.stands(AgentDefinition(name="ops"))
    # An entry that cannot be read kills whatever the definition.
    r_entry = agents.parse_kill("not json")
    assert r_entry is not None and r_entry.stands(AgentDefinition(name="ops", model="other"))


def test_kill_cancels_only_its_agents_turns_and_releases_what_its_pause_held(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    mine, theirs = running(r, "ops at work", "ops"), running(r, "default at work", "default")
    housekeeping = conv_key()
    queue.push_front(r, InboundMessage(key=housekeeping, text="/compact", kind="compact",
                                       agent="ops"))
    assert queue.claim(r, housekeeping.as_str(), "w1", LEASE_S)[0].kind == "claimed"
    send(r, ConversationKey.parse(mine), "queued behind", "ops")
    agents.pause(r, "ops", NOW_MS)
    held = conv_key()
    send(r, held, "held by the pause", "ops")
    assert queue.claim(r, held.as_str(), "w1", LEASE_S)[0].kind == "paused"

    done = on(scratch_redis_url, lambda c: agents.kill_async(c, OPS, NOW_MS))
    assert done == agents.Killed(agents.Kill(NOW_MS, OPS.fingerprint), again=False,
                                 stopped=[mine], released=[held.as_str()])
    assert r.hget(keys.active(mine), "cancelled") == agents.KILL_REASON
    assert not r.hexists(keys.active(theirs), "cancelled")
    assert not r.hexists(keys.active(housekeeping.as_str()), "cancelled")
    # Nothing queued was dropped: each message is refused when it is claimed.
    assert r.llen(keys.inbox(mine)) == 1 and r.llen(keys.inbox(held.as_str())) == 1
    assert not r.exists(keys.agents_paused()) and not r.exists(keys.agents_held())
    assert agents.killed(r, "ops", OPS) == agents.Kill(NOW_MS, OPS.fingerprint)

    again = on(scratch_redis_url, lambda c: agents.kill_async(c, OPS, NOW_MS + 5))
    assert again == agents.Killed(agents.Kill(NOW_MS, OPS.fingerprint), again=True,
                                  stopped=[], released=[])


def test_a_turn_already_delivering_is_not_taken_back(r: redis.Redis, scratch_redis_url: str
                                                     ) -> None:
    conv = running(r, "almost done", "ops")
    r.hset(keys.active(conv), "delivering", "1")
    done = on(scratch_redis_url, lambda c: agents.kill_async(c, OPS, NOW_MS))
    assert done.stopped == [] and not r.hexists(keys.active(conv), "cancelled")


def test_status_says_killed_until_the_agent_is_re_created(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    send(r, conv_key(), "refused later", "ops")
    on(scratch_redis_url, lambda c: agents.kill_async(c, OPS, NOW_MS))

    def status(declared: list[AgentDefinition]) -> tuple[AgentActivity, ...]:
        return on(scratch_redis_url, lambda c: queue_status(
            c, now=NOW_MS / 1000, agents=["default", "ops"], declared=declared)).agents

    assert status([OPS]) == (AgentActivity("default", "created", 0, 0),
                             AgentActivity("ops", "killed", 0, 1, killed_at=NOW_MS))
    # Removed from the configuration: still killed (nothing re-created it).
    assert status([])[1].state == "killed"
    # Declared again with a change: a new agent, its message waiting.
    reborn = OPS.model_copy(update={"model": "m-ops-2"})
    assert status([reborn])[1] == AgentActivity("ops", "active", 0, 1)
    assert agents.killed(r, "ops", reborn) is None and agents.killed(r, "ops", OPS) is not None
