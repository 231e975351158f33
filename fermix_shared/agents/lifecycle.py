"""Agent lifecycle, fleet-wide: pause, resume, and each agent's state (OpenFang's states).

A paused agent's messages are accepted and queue in their conversations' inboxes as usual,
durable; no new turn of it starts (a running turn finishes, and a turn whose worker died is
still resumed). ``claim`` (fermix_shared/lua/claim.lua) finds a paused agent's message at an
inbox head, takes nothing and records the conversation as *held*; :func:`resume` ends the pause
and takes every conversation it held in one step, and the caller dispatches each again, so
they run in order. Compaction jobs are housekeeping, not the agent's turns: never held.

States (:func:`agent_state`): ``paused``; else ``active`` while it has a turn running or
messages waiting, or had a turn start or end within ``IDLE_AFTER_SECONDS``; ``idle`` after
that; ``created`` if it never had a turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis
import redis.asyncio as aioredis

from fermix_shared import keys, lua
from fermix_shared.agents.definitions import IDLE_AFTER_SECONDS

AgentState = Literal["created", "active", "idle", "paused"]


@dataclass(frozen=True)
class Resumed:
    """What :func:`resume` did: whether the agent was paused, and the conversations its pause
    held (each to be dispatched again; returned by exactly one resume)."""

    was_paused: bool
    conversations: list[str]


def agent_state(
    *, paused: bool, active: int, pending: int, last_active_ms: int | None, now_ms: int,
    idle_after_s: float = IDLE_AFTER_SECONDS,
) -> AgentState:
    """The agent's lifecycle state from what Redis holds about it (``now_ms`` injected)."""
    if paused:
        return "paused"
    if active or pending:
        return "active"
    if last_active_ms is None:
        return "created"
    return "active" if now_ms - last_active_ms < idle_after_s * 1000 else "idle"


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _resumed(res: Any) -> Resumed:
    return Resumed(bool(int(res[0])), [_text(c) for c in res[1:]])


def pause(r: redis.Redis, agent: str, now_ms: int) -> int:
    """Pause ``agent`` (again: no change); returns when it was paused (ms)."""
    pipe = r.pipeline(transaction=True)
    pipe.hsetnx(keys.agents_paused(), agent, now_ms)
    pipe.hget(keys.agents_paused(), agent)
    return int(pipe.execute()[1])


async def pause_async(r: aioredis.Redis, agent: str, now_ms: int) -> int:
    """Gateway side of :func:`pause`."""
    pipe = r.pipeline(transaction=True)
    pipe.hsetnx(keys.agents_paused(), agent, now_ms)
    pipe.hget(keys.agents_paused(), agent)
    return int((await pipe.execute())[1])


def resume(r: redis.Redis, agent: str) -> Resumed:
    """End ``agent``'s pause (if any) and take the conversations it held, atomically."""
    return _resumed(lua.RESUME_AGENT(r, paused=keys.agents_paused(), held=keys.agents_held(),
                                     agent=agent))


async def resume_async(r: aioredis.Redis, agent: str) -> Resumed:
    """Gateway side of :func:`resume`."""
    return _resumed(await lua.RESUME_AGENT(r, paused=keys.agents_paused(),
                                           held=keys.agents_held(), agent=agent))


def parse_paused(raw: dict[Any, Any]) -> dict[str, int]:
    """The paused hash as agent -> paused at (ms); unreadable entries still count as paused."""
    out: dict[str, int] = {}
    for name, value in raw.items():
        try:
            out[_text(name)] = int(_text(value))
        except ValueError:
            out[_text(name)] = 0
    return out
