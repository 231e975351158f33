"""Agent lifecycle, fleet-wide: pause, resume, and each agent's state (OpenFang's states).

A paused agent's messages are accepted and queue in their conversations' inboxes as usual,
durable; no new turn of it starts (a running turn finishes, and a turn whose worker died is
still resumed). ``claim`` (fermix_shared/lua/claim.lua) finds a paused agent's message at an
inbox head, takes nothing and records the conversation as *held*; :func:`resume` ends the pause
and takes every conversation it held in one step, and the caller dispatches each again, so
they run in order. Compaction jobs are housekeeping, not the agent's turns: never held.

A killed agent (:func:`kill_async`) takes no turn again: each of its messages is still
accepted, then refused by the worker that claims it, with :data:`KILLED_REPLY` as its reply
(nothing enters history); its running turns are cancelled as /stop cancels one (their
subagents stop with them) and its pause, if any, ends, so that what the pause held is refused
too. Pause and resume cannot bring it back. The kill is recorded against the definition's
fingerprint (:attr:`AgentDefinition.fingerprint`) and stands while the agent is declared
with that definition (or not declared at all): declaring it again with any change re-creates
the agent, and the kill lapses on each process that runs the new definition.

States (:func:`agent_state`): ``killed``; else ``paused``; else ``active`` while it has a turn
running or messages waiting, or had a turn start or end within ``IDLE_AFTER_SECONDS``;
``idle`` after that; ``created`` if it never had a turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import redis
import redis.asyncio as aioredis

from fermix_shared import keys, lua
from fermix_shared.agents.definitions import IDLE_AFTER_SECONDS, AgentDefinition
from fermix_shared.stores.queue import cancel_agent_turns_async

AgentState = Literal["created", "active", "idle", "paused", "killed"]
# What a killed agent's messages get as their reply, and what a turn the kill stopped tells
# its chat.
KILLED_REPLY = ("Sorry, the agent '{agent}' has been permanently stopped by an operator and "
                "takes no new messages. Your message was not processed.")
KILLED_NOTICE = ("Sorry, the agent '{agent}' has been permanently stopped by an operator; "
                 "your request was stopped before it finished.")
# The cancel reason a kill leaves on its agent's running turns.
KILL_REASON = "killed"


@dataclass(frozen=True)
class Kill:
    """A kill as recorded: when (ms) and the fingerprint of the definition it killed."""

    at: int
    fingerprint: str

    def stands(self, definition: AgentDefinition | None) -> bool:
        """Whether the kill holds for ``definition`` (the agent as this process declares
        it): yes unless it was declared again with a change (re-created)."""
        return (definition is None or not self.fingerprint
                or definition.fingerprint == self.fingerprint)


@dataclass(frozen=True)
class Killed:
    """What :func:`kill_async` did: the kill (the first one, when the agent was killed
    already), the conversations whose running turn it cancelled, and those its pause held
    (each to be dispatched again, so their messages get the refusal)."""

    kill: Kill
    again: bool
    stopped: list[str]
    released: list[str]


@dataclass(frozen=True)
class Resumed:
    """What :func:`resume` did: whether the agent was paused, and the conversations its pause
    held (each to be dispatched again; returned by exactly one resume)."""

    was_paused: bool
    conversations: list[str]


def agent_state(
    *, paused: bool, active: int, pending: int, last_active_ms: int | None, now_ms: int,
    idle_after_s: float = IDLE_AFTER_SECONDS, killed: bool = False,
) -> AgentState:
    """The agent's lifecycle state from what Redis holds about it (``now_ms`` injected)."""
    if killed:
        return "killed"
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


def parse_kill(raw: Any) -> Kill | None:
    """A stored kill (None: not killed); an unreadable entry kills every definition."""
    if raw is None:
        return None
    try:
        data = json.loads(_text(raw))
        return Kill(int(data["at"]), str(data["fingerprint"]))
    except (ValueError, KeyError, TypeError):
        return Kill(0, "")


def parse_kills(raw: dict[Any, Any]) -> dict[str, Kill]:
    """The killed hash as agent -> its kill."""
    return {_text(name): kill for name, value in raw.items()
            if (kill := parse_kill(value)) is not None}


def killed(r: redis.Redis, agent: str, definition: AgentDefinition | None) -> Kill | None:
    """The kill that holds for ``agent`` as this process declares it (``definition``, None
    when not declared), or None."""
    return kill_from(r.hget(keys.agents_killed(), agent), definition)


def kill_from(raw: Any, definition: AgentDefinition | None) -> Kill | None:
    """:func:`killed` over the agent's field of ``keys.agents_killed()`` as read (None when
    absent), for a caller that read it along with other things."""
    kill = parse_kill(raw)
    return kill if kill is not None and kill.stands(definition) else None


async def killed_async(r: aioredis.Redis, agent: str,
                       definition: AgentDefinition | None) -> Kill | None:
    """Gateway side of :func:`killed`."""
    kill = parse_kill(await r.hget(keys.agents_killed(), agent))
    return kill if kill is not None and kill.stands(definition) else None


async def kill_async(r: aioredis.Redis, definition: AgentDefinition, now_ms: int) -> Killed:
    """Kill ``definition``'s agent fleet-wide (module docstring): record the kill (killing it
    again keeps the first one), end its pause taking what the pause held, then cancel its
    running turns. The caller dispatches ``released`` and cancels the pending approval of
    each ``stopped`` conversation (a turn parked on one has no worker to notice)."""
    name = definition.name
    first = await killed_async(r, name, definition)
    kill = first or Kill(now_ms, definition.fingerprint)
    if first is None:
        await r.hset(keys.agents_killed(), name,
                     json.dumps({"at": kill.at, "fingerprint": kill.fingerprint}))
    # The record first: a claim made from now on is refused by its worker, and a turn
    # claimed before is in the active index that the cancel reads.
    released = await resume_async(r, name)
    stopped = await cancel_agent_turns_async(r, name, KILL_REASON)
    return Killed(kill, first is not None, stopped, released.conversations)
