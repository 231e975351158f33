"""Every conversation, its state and why it waits, for the console and ``/v1/conversations``.

The index is written where messages are accepted (``accept.lua``: ``keys.conversations``, the
last accepted message's time; ``keys.conversation_agents``, its agent). A conversation's state
comes from the fleet-wide indexes the queue keeps (four membership checks a row):

* ``approval``: a call of its turn waits for a person (``approvals_by_conv``);
* ``running``: a turn holds its lease (``active_index``);
* ``paused``: its next message waits for a paused agent (``agents_held``);
* ``over_budget``: a budget on it or on its agent is reached, so what it sends is refused;
* ``queued``: messages wait for a worker (``queued_index``);
* ``idle``: none of these.

:func:`why_async` says in one sentence why a conversation is where it is, from the real state
(the lease holder and its heartbeat, what is queued, the pause, the approval, a budget).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.approvals import store as approvals
from fermix_shared.usage import budgets
from fermix_shared.usage.periods import ADJECTIVE, reset_phrase

ConversationState = Literal["approval", "running", "paused", "over_budget", "queued", "idle"]
STATES: tuple[ConversationState, ...] = get_args(ConversationState)
MAX_PAGE = 200


@dataclass(frozen=True)
class ConversationRow:
    """One conversation in the list."""

    key: str
    agent: str
    state: ConversationState
    queued: int
    last_ms: int

    @property
    def channel(self) -> str:
        return self.key.split("|", 1)[0]

    def as_json(self) -> dict[str, Any]:
        return {"conversation": self.key, "channel": self.channel, "agent": self.agent,
                "state": self.state, "queued": self.queued, "lastActivityAt": self.last_ms}


@dataclass(frozen=True)
class Page:
    """A page of the list: ``total`` conversations match, these from ``offset``."""

    rows: list[ConversationRow]
    total: int
    offset: int


# Where each state's conversations are listed, in the order a state wins over the next.
_INDEXES: tuple[tuple[ConversationState, str, bool], ...] = (
    ("approval", keys.approvals_by_conv(), True), ("running", keys.active_index(), False),
    ("paused", keys.agents_held(), True), ("queued", keys.queued_index(), False))


async def _reached(r: aioredis.Redis) -> set[str]:
    """The scopes whose budget is reached now (one read of the budgets when none is set)."""
    return {s.budget.scope for s in await budgets.statuses_async(r, None, time.time())
            if s.reached}


async def _states_of(r: aioredis.Redis, convs: list[str]) -> list[ConversationState]:
    """Each conversation's state: four membership checks a row and its agent, in one round
    trip, and the budgets reached."""
    if not convs:
        return []
    reached = await _reached(r)
    async with r.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.conversation_agents(), convs)
        for conv in convs:
            for _, key, is_hash in _INDEXES:
                pipe.hexists(key, conv) if is_hash else pipe.zscore(key, conv)
        agents, *found = await pipe.execute()
    n, out = len(_INDEXES), []
    for i, conv in enumerate(convs):
        held = [state for j, (state, _, _) in enumerate(_INDEXES)
                if found[i * n + j] not in (None, False, 0)]
        over = (f"conversation:{conv}" in reached
                or f"agent:{agents[i] or 'default'}" in reached)
        first = held[0] if held else "idle"
        out.append("over_budget" if over and first in ("queued", "idle") else first)
    return out


async def _members(r: aioredis.Redis, state: ConversationState) -> list[tuple[str, float]]:
    """The conversations that may be in ``state`` (its index's), by last activity, newest
    first; for ``idle`` (and a search of any state), every conversation."""
    index = next(((key, is_hash) for s, key, is_hash in _INDEXES if s == state), None)
    if index is None:
        return await r.zrevrange(keys.conversations(), 0, -1, withscores=True)  # type: ignore[return-value]
    key, is_hash = index
    convs: list[str] = await (r.hkeys(key) if is_hash else r.zrange(key, 0, -1))  # type: ignore[assignment]
    if not convs:
        return []
    scores = await r.zmscore(keys.conversations(), convs)
    return sorted(((c, float(s)) for c, s in zip(convs, scores, strict=True) if s is not None),
                  key=lambda cs: -cs[1])


async def page_async(r: aioredis.Redis, *, q: str = "", state: ConversationState | None = None,
                     offset: int = 0, limit: int = 50) -> Page:
    """The conversations matching ``q`` (a part of the key or the agent, any case) and
    ``state``, the most recently active first: ``limit`` (at most :data:`MAX_PAGE`) from
    ``offset``. Unfiltered, a page reads only its own rows; a state reads its index; a search
    reads the whole list once."""
    limit = max(1, min(limit, MAX_PAGE))
    if not q and state is None:
        async with r.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.conversations())
            pipe.zrevrange(keys.conversations(), offset, offset + limit - 1, withscores=True)
            total, chosen = await pipe.execute()
        return await _rows(r, chosen, int(total), offset, None)
    candidates = await _members(r, state or "idle")
    if q:
        needle = q.lower()
        agents: dict[str, str] = await r.hgetall(keys.conversation_agents())  # type: ignore[assignment]
        candidates = [(c, s) for c, s in candidates
                      if needle in c.lower() or needle in agents.get(c, "").lower()]
    if state is not None:
        states = await _states_of(r, [c for c, _ in candidates])
        candidates = [cs for cs, st in zip(candidates, states, strict=True) if st == state]
    return await _rows(r, candidates[offset:offset + limit], len(candidates), offset, state)


async def _rows(r: aioredis.Redis, chosen: list[tuple[str, float]], total: int, offset: int,
                state: ConversationState | None) -> Page:
    convs = [c for c, _ in chosen]
    if not convs:
        return Page([], total, offset)
    states = [state] * len(convs) if state is not None else await _states_of(r, convs)
    async with r.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.conversation_agents(), convs)
        for conv in convs:
            pipe.llen(keys.inbox(conv))
        agents_of, *lengths = await pipe.execute()
    rows = [ConversationRow(c, agents_of[i] or "default", states[i] or "idle", int(lengths[i]),
                            int(score)) for i, (c, score) in enumerate(chosen)]
    return Page(rows, total, offset)


def _ago(ms: float, now_ms: float) -> str:
    s = max(0, round((now_ms - ms) / 1000))
    return f"{s} s ago" if s < 120 else f"{s // 60} min ago"


async def why_async(r: aioredis.Redis, conv: str, now: float | None = None) -> str:
    """One sentence: why ``conv`` is waiting (or what it is doing), from the real state."""
    now_ms = (time.time() if now is None else now) * 1000
    async with r.pipeline(transaction=False) as pipe:
        pipe.hget(keys.approvals_by_conv(), conv)
        pipe.hgetall(keys.active(conv))
        pipe.hget(keys.agents_held(), conv)
        pipe.zscore(keys.queued_index(), conv)
        pipe.llen(keys.inbox(conv))
        pipe.zscore(keys.conversations(), conv)
        pipe.hget(keys.conversation_agents(), conv)
        approval_id, active, held, since, queued, last, agent = await pipe.execute()
    behind = f"; {queued} more queued behind it" if queued else ""
    if approval_id and (found := await approvals.get_async(r, approval_id)) is not None:
        req = found.request
        return (f"Waiting for a person to approve {req.tool} (asked "
                f"{_ago(req.requested_at * 1000, now_ms)}, expires in "
                f"{max(0, round(req.expires_at - now_ms / 1000))} s){behind}.")
    if active.get("worker"):
        beat = await r.hget(keys.worker_beats(), active["worker"])
        since = await _started(r, active.get("turn_id", ""), now_ms)
        heartbeat = (f"its heartbeat {max(0, round((now_ms - float(beat)) / 1000))} s old"
                     if beat and float(beat) > 0 else "no heartbeat from it")
        waiting = await _retrying(r, active.get("turn_id", ""), now_ms)
        return (f"Running: held by worker {active['worker']}{since}, {heartbeat}{waiting}"
                f"{behind}.")
    if held:
        return (f"Waiting: the agent {held} is paused, so its {queued} message"
                f"{' waits' if queued == 1 else 's wait'} (fermix agents resume {held}).")
    reached = await _budget_reached(r, conv, agent or "default", now_ms / 1000)
    if since is not None:
        return (f"Queued: {queued} message{'' if queued == 1 else 's'} waiting for a worker "
                f"since {_ago(float(since), now_ms)}.{reached}")
    if last is None:
        return "No message has been accepted in this conversation."
    return f"Idle: its last message was accepted {_ago(float(last), now_ms)}.{reached}"


async def _started(r: aioredis.Redis, run_id: str, now_ms: float) -> str:
    """`` since HH:MM:SS UTC (N s)``: when the running turn started, from its run record."""
    raw = await r.get(keys.run(run_id)) if run_id else None
    started = json.loads(raw).get("started_at") if raw else None
    if not started:
        return ""
    at = datetime.fromtimestamp(started, UTC).strftime("%H:%M:%S")
    return f" since {at} UTC ({max(0, round((now_ms / 1000) - started))} s)"


async def _retrying(r: aioredis.Redis, run_id: str, now_ms: float) -> str:
    """``; waiting N s to retry the provider (reason)`` when the turn's latest event is a
    retry whose wait has not passed (the provider refused: a 429, an overload, a timeout)."""
    if not run_id:
        return ""
    last: Any = await r.xrevrange(keys.run_events(run_id), "+", "-", count=1)
    if not last:
        return ""
    entry_id, fields = last[0]
    data = json.loads(fields.get("data", "{}"))
    if fields.get("stream") != "diagnostic" or data.get("kind") != "retry":
        return ""
    left = int(entry_id.split("-")[0]) + float(data.get("delay", 0)) * 1000 - now_ms
    if left <= 0:
        return ""
    return (f"; waiting {max(1, round(left / 1000))} s to retry the provider "
            f"({data.get('reason', 'it refused')}, attempt {data.get('attempt', 1)})")


async def _budget_reached(r: aioredis.Redis, conv: str, agent: str, now: float) -> str:
    """`` <The budget> is reached: …`` when a budget of the conversation or its agent is."""
    found = await budgets.statuses_async(r, [f"conversation:{conv}", f"agent:{agent}"], now)
    for status in found:
        if status.reached:
            b = status.budget
            return (f" The {ADJECTIVE[b.period]} budget of {b.scope} is reached: new messages "
                    f"are refused until it resets {reset_phrase(b.period, status.when)}.")
    return ""
