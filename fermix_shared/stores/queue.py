"""The conversation queue in Redis: a durable inbox per key and one active turn per key.

Every multi-key change is one Lua script in :mod:`fermix_shared.lua` (here ``accept``,
``stop``, ``claim``, ``unpark``, ``push_front``; what the holder of a turn does, ``renew``,
``take_steer``, ``finish`` and the rest, is :class:`~fermix_shared.stores.lease.TurnLease`'s),
so the rules hold across any number of gateway and worker processes. Two indexes make the
fleet's state cheap to read: ``active_index`` (conv -> lease expiry) for the reaper and status,
``queued_index`` (conv -> waiting since) for conversations with pending messages.

A paused agent (:mod:`fermix_shared.agents.lifecycle`) starts no new turn: ``claim`` leaves a
message for it at the inbox head and records the conversation as held, and resuming the agent
dispatches every held conversation again. ``claim`` and ``finish`` also stamp the agent's last
activity, for its ``idle`` state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

import redis
import redis.asyncio as aioredis

from fermix_shared import keys, lua, tracing
from fermix_shared.models import InboundMessage, QueueMode, RunRecord
from fermix_shared.stores.lease import TurnLease, now_ms


class AcceptCode(IntEnum):
    duplicate = 0
    queued = 1
    refused = 2
    steered = 3
    # Refused by an AcceptLimits: the conversation has max_queued messages waiting; the sender
    # is past its rate (Accepted.retry_after_ms says for how long).
    full = 4
    rate_limited = 5


# The sender rate's period: AcceptLimits.per_minute.
RATE_PERIOD_MS = 60_000


@dataclass(frozen=True)
class AcceptLimits:
    """What :func:`accept` refuses, atomically with the rest of it (0 turns a limit off).

    ``max_queued``: messages waiting in the conversation (inbox and steer list) behind its
    turn; one more is ``full``. ``per_minute``: messages ``sender`` (``channel:user``) may have
    accepted per minute, in a burst or spread out; past it, ``rate_limited``. Duplicates and
    refused messages cost no rate.
    """

    sender: str = ""
    max_queued: int = 0
    per_minute: int = 0


@dataclass(frozen=True)
class StopResult:
    """What a /stop (or an interrupt) did: the turn it cancelled, the messages it cleared."""

    active_run: str | None
    cleared: list[InboundMessage]


@dataclass(frozen=True)
class Accepted:
    """Result of accepting a message: its run id and what happened to it."""

    run_id: str
    code: AcceptCode
    # rate_limited: how long until the sender may send again.
    retry_after_ms: int = 0
    # interrupt mode, a new message: what it stopped (never set for a duplicate or a refusal).
    interrupted: StopResult | None = None

    @property
    def new(self) -> bool:
        return self.code in (AcceptCode.queued, AcceptCode.steered)


@dataclass(frozen=True)
class Claim:
    """Outcome of trying to take a conversation.

    ``messages`` holds the turn's message first, then (collect mode) the ones merged into it.
    ``cancelled`` is set for an orphan that had been cancelled before its worker died.
    """

    kind: Literal["busy", "empty", "paused", "claimed", "orphan"]
    messages: list[InboundMessage] = field(default_factory=list)
    cancelled: str = ""
    # 1 for a fresh turn; 2, 3, ... for each recovery of a turn whose worker died.
    attempt: int = 1
    # ``paused``: the agent the inbox head waits for (nothing was taken).
    agent: str = ""


def _accept_args(
    msg: InboundMessage, mode: QueueMode, message_id: str | None, limits: AcceptLimits | None
) -> dict[str, lua.Arg]:
    conv = msg.key.as_str()
    run_key = keys.run(msg.run_id)
    record = RunRecord(run_id=msg.run_id, conversation=msg.key, accepted_at=msg.accepted_at,
                       trace_id=tracing.trace_id_of(msg.trace))
    limits = limits or AcceptLimits()
    rated = bool(limits.sender and limits.per_minute > 0)
    return {
        "mark": keys.dedupe(conv, message_id) if message_id else run_key,
        "inbox": keys.inbox(conv),
        "run": run_key,
        "active": keys.active(conv),
        "steer": keys.steer(conv),
        "queued_index": keys.queued_index(),
        "sender_rate": keys.rate_limit(f"inbound:{limits.sender}") if rated else run_key,
        "paused": keys.agents_paused(),
        "held": keys.agents_held(),
        "conversations": keys.conversations(),
        "conversation_agents": keys.conversation_agents(),
        "conv_runs": keys.conv_runs(conv),
        "run_id": msg.run_id,
        "message": msg.model_dump_json(),
        "record": record.model_dump_json(),
        "dedupe_ttl_s": keys.DEDUPE_TTL_SECONDS,
        "run_ttl_s": keys.RUN_TTL_SECONDS,
        "has_mark": "1" if message_id else "0",
        "mode": mode,
        "conv": conv,
        "now_ms": now_ms(),
        "max_queued": limits.max_queued,
        "rate_count": limits.per_minute if rated else 0,
        "rate_period_ms": RATE_PERIOD_MS,
        "agent": msg.agent,
    }


def _accepted(res: Any) -> Accepted:
    retry_after = int(res[2]) if len(res) > 2 else 0
    interrupted = _stop_result(res[3:]) if len(res) > 3 else None
    return Accepted(run_id=res[0], code=AcceptCode(int(res[1])), retry_after_ms=retry_after,
                    interrupted=interrupted)


async def accept_async(
    r: aioredis.Redis, msg: InboundMessage, *, mode: QueueMode = "followup",
    message_id: str | None = None, limits: AcceptLimits | None = None,
) -> Accepted:
    """Gateway side of :func:`accept`."""
    return _accepted(await lua.ACCEPT(r, **_accept_args(msg, mode, message_id, limits)))


def accept(
    r: redis.Redis, msg: InboundMessage, *, mode: QueueMode = "followup",
    message_id: str | None = None, limits: AcceptLimits | None = None,
) -> Accepted:
    """Durably queue ``msg`` and create its run record, in one atomic step.

    With ``message_id``, a message already accepted under that id in the conversation is not
    queued again (``duplicate``, with the first run's id). ``reject`` mode refuses while the
    conversation is busy; ``steer`` mode hands the message to the active turn (unless its
    agent is paused: it queues then); ``interrupt`` mode cancels the active turn and clears
    the queue first, as :func:`stop_async` does (``Accepted.interrupted``), but only for a
    message it queues: a duplicate or a refused message stops nothing. ``limits`` (none by
    default: jobs of our own are never refused) can refuse it as ``full`` or
    ``rate_limited``; nothing is written then.
    """
    return _accepted(lua.ACCEPT(r, **_accept_args(msg, mode, message_id, limits)))


def _stop_keys(conv: str) -> dict[str, lua.Arg]:
    return {"active": keys.active(conv), "inbox": keys.inbox(conv),
            "queued_index": keys.queued_index(), "steer": keys.steer(conv),
            "held": keys.agents_held()}


def _stop_result(res: Any) -> StopResult:
    return StopResult(res[0] or None, [InboundMessage.model_validate_json(m) for m in res[1:]])


async def stop_async(r: aioredis.Redis, conv: str, reason: str = "stop") -> StopResult:
    """Cancel the active turn (cooperatively: its worker winds down) and clear the queue."""
    res = await lua.STOP(r, **_stop_keys(conv), reason=reason, conv=conv)
    return _stop_result(res)


def _turn_agent(raw: Any) -> str | None:
    """The agent an active turn's message is for; None for a compaction job (housekeeping)."""
    try:
        msg = InboundMessage.model_validate_json(raw)
    except ValueError:
        return None
    return None if msg.kind == "compact" else msg.agent


async def cancel_agent_turns_async(r: aioredis.Redis, agent: str, reason: str) -> list[str]:
    """Cancel every active turn of ``agent`` fleet-wide, as /stop cancels one (its worker
    winds down, its subagents stop), but leave every queue as it is; returns the
    conversations whose turn was cancelled. A turn already delivering finishes."""
    convs = [c.decode() if isinstance(c, bytes) else str(c)
             for c in await r.zrange(keys.active_index(), 0, -1)]
    reads = r.pipeline(transaction=False)
    for conv in convs:
        reads.hmget(keys.active(conv), ["turn_id", "message"])
    cancelled = []
    for conv, (turn_id, message) in zip(convs, await reads.execute(), strict=True):
        if turn_id and message and _turn_agent(message) == agent and int(
                await lua.CANCEL_TURN(r, active=keys.active(conv), turn_id=turn_id,
                                      reason=reason)):
            cancelled.append(conv)
    return cancelled


def unpark(
    r: redis.Redis, conv: str, turn_id: str, worker: str, lease_s: float
) -> tuple[Claim, TurnLease] | None:
    """Take back a turn parked on a fan-out (its callback runs on ``worker``)."""
    res: Any = lua.UNPARK(r, active=keys.active(conv), active_index=keys.active_index(),
                          turn_id=turn_id, worker=worker, lease_ms=int(lease_s * 1000),
                          now_ms=now_ms(), conv=conv)
    if not res:
        return None
    msg = InboundMessage.model_validate_json(res[0])
    return Claim("claimed", [msg], res[1]), TurnLease(r, conv, turn_id, worker, lease_s)


def claim(
    r: redis.Redis, conv: str, worker: str, lease_s: float, *, collect: bool = False
) -> tuple[Claim, TurnLease | None]:
    """Try to become the conversation's active turn (popping the inbox head, or in collect
    mode every message of the head's agent up to a compaction job or another agent's message).
    ``collect`` is the channel's mode; the conversation's own (``/queue MODE``) wins, read in
    the same step (one round trip).

    ``paused``: the head is a message for a paused agent; nothing is taken, and resuming the
    agent dispatches the conversation again. ``busy`` and ``empty``: nothing to run either.
    """
    res: Any = lua.CLAIM(
        r, active=keys.active(conv), inbox=keys.inbox(conv), active_index=keys.active_index(),
        queued_index=keys.queued_index(), paused=keys.agents_paused(), held=keys.agents_held(),
        last_active=keys.agents_last_active(), mode=keys.queue_mode(conv), worker=worker,
        lease_ms=int(lease_s * 1000),
        now_ms=now_ms(), conv=conv, collect="1" if collect else "0",
    )
    kind = res[0]
    if kind in ("busy", "empty"):
        return Claim(kind), None
    if kind == "paused":
        return Claim(kind, agent=str(res[1])), None
    if kind == "orphan":
        msg = InboundMessage.model_validate_json(res[1])
        lease = TurnLease(r, conv, msg.run_id, worker, lease_s)
        return Claim(kind, [msg], res[2], int(res[3])), lease
    msgs = [InboundMessage.model_validate_json(m) for m in res[1:]]
    return Claim(kind, msgs), TurnLease(r, conv, msgs[0].run_id, worker, lease_s)


QUEUE_MODES: tuple[QueueMode, ...] = ("followup", "collect", "steer", "interrupt", "reject")


def parse_mode(raw: Any) -> QueueMode | None:
    """A stored queue mode, or None when unset or unknown."""
    for mode in QUEUE_MODES:
        if raw == mode:
            return mode
    return None


def queue_mode(r: redis.Redis, conv: str) -> QueueMode | None:
    """The conversation's own queue mode, if one was set (``/queue MODE``)."""
    return parse_mode(r.get(keys.queue_mode(conv)))


async def queue_mode_async(r: aioredis.Redis, conv: str) -> QueueMode | None:
    return parse_mode(await r.get(keys.queue_mode(conv)))


async def first_delivery_async(r: aioredis.Redis, delivery_id: str) -> bool:
    """True the first time ``delivery_id`` is seen (a platform retry gets False)."""
    return bool(await r.set(keys.dedupe("delivery", delivery_id), "1", nx=True,
                            ex=keys.DEDUPE_TTL_SECONDS))


def push_front(r: redis.Redis, msg: InboundMessage) -> int:
    """Queue ``msg`` ahead of everything waiting in its conversation; returns the inbox size."""
    conv = msg.key.as_str()
    return int(lua.PUSH_FRONT(r, inbox=keys.inbox(conv), queued_index=keys.queued_index(),
                              message=msg.model_dump_json(), conv=conv, now_ms=now_ms()))
