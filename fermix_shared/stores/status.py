"""Queue activity and worker liveness, read from the indexes the queue scripts maintain.

Read-only: two round trips (a MULTI snapshot of the two indexes, the worker hash and the agent
lifecycle hashes, then the inboxes), so the counts are consistent with each other but the
inboxes may be a few milliseconds younger than the indexes.

Per agent (when asked for agents): ``active`` counts the conversations whose active turn's
message is for it, ``pending`` the messages for it waiting in inboxes; both read every
conversation the indexes name (one pipelined command each), so this is an operator's read,
not a hot path. Compaction jobs are the conversation's housekeeping and count for no agent.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.agents.definitions import DEFAULT_AGENT, AgentDefinition, agent_named
from fermix_shared.agents.lifecycle import AgentState, agent_state, parse_kills, parse_paused

# Conversations listed one by one; the counts always cover all of them.
DETAIL_LIMIT = 50


@dataclass(frozen=True)
class WorkerSeen:
    """A worker whose heartbeat is younger than ``keys.WORKER_SEEN_TTL_SECONDS``."""

    name: str
    last_seen_ago: float


@dataclass(frozen=True)
class ConversationActivity:
    """One conversation with an active turn or waiting messages.

    ``lease_expires_in`` is seconds until the active turn's lease lapses (negative when it has
    lapsed and the turn awaits recovery); None without an active turn.
    """

    conversation: str
    active: bool
    lease_expires_in: float | None
    pending: int


@dataclass(frozen=True)
class AgentActivity:
    """One agent's lifecycle state (fermix_shared/agents/lifecycle.py), its conversations with
    an active turn, its messages waiting, and when it last started or ended a turn and was
    paused or killed (ms; None if never / not paused / not killed)."""

    name: str
    state: AgentState
    active: int
    pending: int
    last_active_at: int | None = None
    paused_at: int | None = None
    killed_at: int | None = None


@dataclass(frozen=True)
class QueueStatus:
    """Fleet-wide queue activity: one active turn per conversation, messages waiting behind,
    and (when asked for) each agent's activity."""

    active_conversations: int
    pending_conversations: int
    active_requests: int
    pending_requests: int
    workers: tuple[WorkerSeen, ...]
    conversations: tuple[ConversationActivity, ...]
    agents: tuple[AgentActivity, ...] = ()


def _text(x: Any) -> str:
    """Redis replies as ``str`` whether or not the client decodes responses."""
    return x.decode() if isinstance(x, bytes) else str(x)


def _workers_seen(raw: dict[str, str], now: float) -> tuple[WorkerSeen, ...]:
    seen = []
    for name, value in raw.items():
        try:
            ago = max(0.0, now - float(value))
        except ValueError:
            continue
        if ago <= keys.WORKER_SEEN_TTL_SECONDS:
            seen.append(WorkerSeen(name, round(ago, 1)))
    return tuple(sorted(seen, key=lambda w: w.name))


def _agent_of(raw: Any) -> str | None:
    """The agent a queued (or active) message is for; None for a compaction job or a record
    that is not a message."""
    try:
        msg = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(msg, dict) or msg.get("kind") == "compact":
        return None
    return str(msg.get("agent") or DEFAULT_AGENT)


def _agents(
    names: Sequence[str], declared: Sequence[AgentDefinition], active_messages: list[Any],
    inboxes: list[list[Any]], raw: list[Any], now: float,
) -> tuple[AgentActivity, ...]:
    active = Counter(a for a in map(_agent_of, active_messages) if a)
    pending = Counter(a for inbox in inboxes for a in map(_agent_of, inbox) if a)
    paused_raw, last_raw, killed_raw = raw
    paused, last, kills = parse_paused(paused_raw), parse_paused(last_raw), parse_kills(killed_raw)
    now_ms = int(now * 1000)
    out = []
    for name in names:
        kill = kills.get(name)
        if kill is not None and not kill.stands(agent_named(list(declared), name)):
            kill = None  # declared again with a change: a new agent
        out.append(AgentActivity(
            name=name,
            state=agent_state(paused=name in paused, active=active[name], pending=pending[name],
                              last_active_ms=last.get(name), now_ms=now_ms,
                              killed=kill is not None),
            active=active[name], pending=pending[name], last_active_at=last.get(name),
            paused_at=paused.get(name), killed_at=kill.at if kill else None,
        ))
    return tuple(out)


async def queue_status(
    r: aioredis.Redis, *, now: float | None = None, agents: Sequence[str] = (),
    declared: Sequence[AgentDefinition] = (),
) -> QueueStatus:
    """Counts over every conversation, detail for up to ``DETAIL_LIMIT`` of them, and the
    activity of each agent named in ``agents`` (none by default); ``declared`` (the
    ``[[agents]]``) tells a kill that stands from one whose agent was re-created.

    Detail lists active conversations first (soonest lease expiry first), then waiting ones
    (longest wait first). ``now`` (unix seconds) is for tests; the wall clock otherwise, as
    leases and heartbeats are written in wall-clock time.
    """
    now = time.time() if now is None else now
    per_agent = bool(agents)
    active, queued, workers_raw, agents_raw = await _snapshot(r, per_agent)
    shown = list(active)[:DETAIL_LIMIT]
    shown += [c for c in queued if c not in active][: DETAIL_LIMIT - len(shown)]
    counted = list(dict.fromkeys([*queued, *shown]))
    inboxes, active_messages = await _read_inboxes(r, counted, active, per_agent)
    lengths = [len(x) for x in inboxes] if per_agent else [int(x) for x in inboxes]
    pending: dict[str, int] = dict(zip(counted, lengths, strict=True))
    agent_activity: tuple[AgentActivity, ...] = ()
    if per_agent:
        agent_activity = _agents(agents, declared, active_messages, inboxes, agents_raw, now)

    return QueueStatus(
        active_conversations=len(active),
        pending_conversations=len(queued),
        # One active turn per conversation, so active requests and conversations agree.
        active_requests=len(active),
        pending_requests=sum(pending[c] for c in queued),
        workers=_workers_seen({_text(k): _text(v) for k, v in workers_raw.items()}, now),
        conversations=_conversations(shown, active, pending, now),
        agents=agent_activity,
    )


async def _snapshot(
    r: aioredis.Redis, per_agent: bool
) -> tuple[dict[str, float], list[str], dict[Any, Any], list[Any]]:
    """The first round trip, one MULTI: the active index (conv -> lease expiry, ms), the queued
    index, the worker hash and, per agent, the paused, last-active and killed hashes."""
    snap = r.pipeline(transaction=True)
    snap.zrange(keys.active_index(), 0, -1, withscores=True)
    snap.zrange(keys.queued_index(), 0, -1)
    snap.hgetall(keys.workers())
    if per_agent:
        snap.hgetall(keys.agents_paused())
        snap.hgetall(keys.agents_last_active())
        snap.hgetall(keys.agents_killed())
    active_raw, queued_raw, workers_raw, *agents_raw = await snap.execute()
    active: dict[str, float] = {_text(conv): float(until) for conv, until in active_raw}
    queued: list[str] = [_text(conv) for conv in queued_raw]
    return active, queued, workers_raw, agents_raw


async def _read_inboxes(
    r: aioredis.Redis, counted: list[str], active: dict[str, float], per_agent: bool
) -> tuple[list[Any], list[Any]]:
    """The second round trip: each counted conversation's inbox, and per agent each active
    turn's message (empty otherwise)."""
    reads = r.pipeline(transaction=False)
    for conv in counted:
        # Per agent, the messages themselves; else their number is enough.
        if per_agent:
            reads.lrange(keys.inbox(conv), 0, -1)
        else:
            reads.llen(keys.inbox(conv))
    if per_agent:
        for conv in active:
            reads.hget(keys.active(conv), "message")
    replies = await reads.execute()
    return replies[:len(counted)], replies[len(counted):]


def _conversations(
    shown: list[str], active: dict[str, float], pending: dict[str, int], now: float
) -> tuple[ConversationActivity, ...]:
    return tuple(
        ConversationActivity(
            conversation=conv,
            active=conv in active,
            lease_expires_in=(
                round(active[conv] / 1000 - now, 1) if conv in active else None
            ),
            pending=pending[conv],
        )
        for conv in shown
    )
