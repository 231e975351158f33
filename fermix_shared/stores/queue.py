"""The conversation queue in Redis: a durable inbox per key and one active turn per key.

Every multi-key change is one Lua script in :mod:`fermix_shared.lua` (``accept``, ``claim``,
``renew``, ``take_steer``, ``finish``, ``stop``), so the rules hold across any number of gateway and
worker processes. Two indexes make the fleet's state cheap to read: ``active_index`` (conv ->
lease expiry) for the reaper and status, ``queued_index`` (conv -> waiting since) for
conversations with pending messages.

A paused agent (:mod:`fermix_shared.agents.lifecycle`) starts no new turn: ``claim`` leaves a
message for it at the inbox head and records the conversation as held, and resuming the agent
dispatches every held conversation again. ``claim`` and ``finish`` also stamp the agent's last
activity, for its ``idle`` state.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal, TypeAlias

import redis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from fermix_shared import keys, lua
from fermix_shared.models import InboundMessage, QueueMode, RunRecord
from fermix_shared.stores.lease_results import (
    DeliveryGate,
    FinishResult,
    delivery_gate,
    finish_result,
)


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
class Stopped:
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
    interrupted: Stopped | None = None

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


def now_ms() -> int:
    return int(time.time() * 1000)


def _accept_args(
    msg: InboundMessage, mode: QueueMode, message_id: str | None, limits: AcceptLimits | None
) -> dict[str, lua.Arg]:
    conv = msg.key.as_str()
    run_key = keys.run(msg.run_id)
    record = RunRecord(run_id=msg.run_id, conversation=msg.key, accepted_at=msg.accepted_at)
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
    interrupted = _stopped(res[3:]) if len(res) > 3 else None
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


def _stopped(res: Any) -> Stopped:
    return Stopped(res[0] or None, [InboundMessage.model_validate_json(m) for m in res[1:]])


async def stop_async(r: aioredis.Redis, conv: str, reason: str = "stop") -> Stopped:
    """Cancel the active turn (cooperatively: its worker winds down) and clear the queue."""
    res = await lua.STOP(r, **_stop_keys(conv), reason=reason, conv=conv)
    return _stopped(res)


class TurnLease:
    """One worker's hold on one conversation's active turn."""

    def __init__(self, r: redis.Redis, conv: str, turn_id: str, worker: str, lease_s: float):
        self._r = r
        self.conv = conv
        self.turn_id = turn_id
        self.worker = worker
        self.lease_ms = int(lease_s * 1000)

    def renew(self) -> Renewal:
        """Extend the lease. Returns (still held, cancellation reason or ""). Many leases at
        once: :func:`renew_leases`."""
        (answer,) = _renew_pipelined(self._r, [self])
        if isinstance(answer, Exception):
            raise answer
        return answer

    @functools.cached_property
    def _renew_command(self) -> list[Any]:
        """EVALSHA's arguments after the hash, ``now_ms`` left at 0 (bound once: a renewer
        sends them every interval)."""
        names, args = lua.RENEW.bind({
            "active": keys.active(self.conv), "active_index": keys.active_index(),
            "turn_id": self.turn_id, "worker": self.worker, "lease_ms": self.lease_ms,
            "now_ms": 0, "conv": self.conv})
        return [len(names), *names, *args]

    def take_steered(self) -> list[InboundMessage]:
        """Messages steered into this turn since the last call (steer mode)."""
        res: Any = lua.TAKE_STEER(
            self._r, active=keys.active(self.conv), steer=keys.steer(self.conv),
            turn_id=self.turn_id, worker=self.worker,
        )
        return [InboundMessage.model_validate_json(m) for m in res]

    def park(self, until_s: float) -> bool:
        """Give the worker back while the turn waits on a fan-out; the conversation stays
        taken until ``until_s`` seconds from now (then the reaper recovers it)."""
        until = now_ms() + int(until_s * 1000)
        res = lua.PARK(self._r, active=keys.active(self.conv), active_index=keys.active_index(),
                       turn_id=self.turn_id, worker=self.worker, lease_until_ms=until,
                       conv=self.conv)
        return int(res) == 1

    def begin_delivery(self, via: redis.Redis | None = None, mark: str = "1") -> DeliveryGate:
        """Before sending to a platform: :class:`Cleared` to go ahead, :class:`Fenced`, or
        :class:`StopWon` (/stop came first). ``via``: a client of the same pool pinned to one
        connection, for a WAIT on the mark; ``mark``: the mark's value, under a durability
        wait the primary's replication id (fermix_shared/redis/durability.py DeliveryWait)."""
        return delivery_gate(int(lua.BEGIN_DELIVERY(
            via or self._r, active=keys.active(self.conv), turn_id=self.turn_id,
            worker=self.worker, mark=mark,
        )))

    def delivery_mark(self, delivery_id: str) -> str | None:
        """The mark an earlier holder of this turn left when it began delivering its reply
        (its value, :meth:`begin_delivery`), if no chunk of the reply is marked sent; else
        None. The send may have happened or not: only a failover since the mark can have lost
        chunk marks written after a send (fermix_shared/redis/durability.py DeliveryWait)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.hget(keys.active(self.conv), "delivering")
        pipe.exists(keys.delivered(delivery_id))
        marked, sent = pipe.execute()
        if marked is None or sent:
            return None
        return marked.decode() if isinstance(marked, bytes) else str(marked)

    def finish(
        self, record: RunRecord, history: list[str], history_cap: int, *, deliver: bool
    ) -> FinishResult:
        """Write ``record`` and ``history`` and release the conversation, atomically.

        :class:`Released` with the messages waiting; :class:`Fenced` (this turn no longer
        holds the conversation) or :class:`StopWon` (``deliver`` lost the race with a /stop):
        nothing written in those two cases.
        """
        conv = self.conv
        return finish_result(int(
            lua.FINISH(
                self._r,
                active=keys.active(conv), inbox=keys.inbox(conv), run=keys.run(record.run_id),
                history=keys.history(conv), active_index=keys.active_index(),
                queued_index=keys.queued_index(), steer=keys.steer(conv),
                last_active=keys.agents_last_active(), turn_id=self.turn_id,
                worker=self.worker, record=record.model_dump_json(),
                run_ttl_s=keys.RUN_TTL_SECONDS, history_cap=history_cap, conv=conv,
                now_ms=now_ms(), mode="deliver" if deliver else "close", entries=history,
            )
        ))


Renewal: TypeAlias = tuple[bool, str]
"""A renewal's answer: (the turn still holds its conversation, cancellation reason or "")."""

# The name EVALSHA knows renew.lua by (Redis hashes the same bytes).
_RENEW_SHA = hashlib.sha1(lua.RENEW.source.encode()).hexdigest()
# Where now_ms sits in a lease's _renew_command (after the key count, the keys, the args).
_NOW_AT = 1 + len(lua.RENEW.keys) + lua.RENEW.args.index("now_ms")


def renew_leases(leases: Sequence[TurnLease]) -> list[Renewal | Exception]:
    """Renew many leases, one round trip per Redis client: a pipeline (no transaction) of
    plain EVALSHA (a registered script's pipeline would ask SCRIPT EXISTS first, a second
    round trip); calls refused with NOSCRIPT (restart, failover, ``SCRIPT FLUSH``) go again
    once the script is loaded. In order, each lease's :data:`Renewal` or the error it met:
    its pipeline's (Redis unreachable after the client's retries) or its own call's."""
    by_client: dict[int, list[int]] = {}
    for i, lease in enumerate(leases):
        by_client.setdefault(id(lease._r), []).append(i)
    answers: dict[int, Renewal | Exception] = {}
    for positions in by_client.values():
        batch = [leases[i] for i in positions]
        try:
            got = _renew_pipelined(batch[0]._r, batch)
        except Exception as e:  # the caller decides: a blip is retried next interval
            got = [e] * len(batch)
        answers.update(zip(positions, got, strict=True))
    return [answers[i] for i in range(len(leases))]


def _renew_pipelined(r: redis.Redis, leases: Sequence[TurnLease]) -> list[Renewal | Exception]:
    def send(batch: Sequence[TurnLease], sha: str) -> list[Any]:
        pipe = r.pipeline(transaction=False)
        now = now_ms()
        for lease in batch:
            command = lease._renew_command.copy()
            command[_NOW_AT] = now
            pipe.evalsha(sha, *command)
        return pipe.execute(raise_on_error=False)

    answers = send(leases, _RENEW_SHA)
    unknown = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
    if unknown:
        sha = str(r.script_load(lua.RENEW.source))
        for i, answer in zip(unknown, send([leases[i] for i in unknown], sha), strict=True):
            answers[i] = answer
    return [a if isinstance(a, Exception) else (int(a[0]) > 0, str(a[1]) if int(a[0]) == 2 else "")
            for a in answers]


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

    ``paused``: the head is a message for a paused agent; nothing is taken, and resuming the
    agent dispatches the conversation again. ``busy`` and ``empty``: nothing to run either.
    """
    res: Any = lua.CLAIM(
        r, active=keys.active(conv), inbox=keys.inbox(conv), active_index=keys.active_index(),
        queued_index=keys.queued_index(), paused=keys.agents_paused(), held=keys.agents_held(),
        last_active=keys.agents_last_active(), worker=worker, lease_ms=int(lease_s * 1000),
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
