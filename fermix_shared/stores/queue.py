"""The conversation queue in Redis: a durable inbox per key and one active turn per key.

Every multi-key change is one Lua script next to this file (``accept``, ``claim``, ``renew``,
``take_steer``, ``finish``, ``stop``), so the rules hold across any number of gateway and
worker processes. Two indexes make the fleet's state cheap to read: ``active_index`` (conv ->
lease expiry) for the reaper and status, ``queued_index`` (conv -> waiting since) for
conversations with pending messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.models import InboundMessage, QueueMode, RunRecord
from fermix_shared.stores._lua import lua


class AcceptCode(IntEnum):
    duplicate = 0
    queued = 1
    refused = 2
    steered = 3


@dataclass(frozen=True)
class Accepted:
    """Result of accepting a message: its run id and what happened to it."""

    run_id: str
    code: AcceptCode

    @property
    def new(self) -> bool:
        return self.code in (AcceptCode.queued, AcceptCode.steered)


@dataclass(frozen=True)
class Claim:
    """Outcome of trying to take a conversation.

    ``messages`` holds the turn's message first, then (collect mode) the ones merged into it.
    ``cancelled`` is set for an orphan that had been cancelled before its worker died.
    """

    kind: Literal["busy", "empty", "claimed", "orphan"]
    messages: list[InboundMessage] = field(default_factory=list)
    cancelled: str = ""
    # 1 for a fresh turn; 2, 3, ... for each recovery of a turn whose worker died.
    attempt: int = 1


@dataclass(frozen=True)
class Stopped:
    """What a /stop (or an interrupt) did: the turn it cancelled, the messages it cleared."""

    active_run: str | None
    cleared: list[InboundMessage]


def now_ms() -> int:
    return int(time.time() * 1000)


def _accept_args(
    msg: InboundMessage, mode: QueueMode, message_id: str | None
) -> tuple[list[str], list[str | int]]:
    conv = msg.key.as_str()
    run_key = keys.run(msg.run_id)
    mark = keys.dedupe(conv, message_id) if message_id else run_key
    record = RunRecord(run_id=msg.run_id, conversation=msg.key, accepted_at=msg.accepted_at)
    return (
        [mark, keys.inbox(conv), run_key, keys.active(conv), keys.steer(conv), keys.queued_index()],
        [
            msg.run_id,
            msg.model_dump_json(),
            record.model_dump_json(),
            keys.DEDUPE_TTL_SECONDS,
            keys.RUN_TTL_SECONDS,
            "1" if message_id else "0",
            mode,
            conv,
            now_ms(),
        ],
    )


def _accepted(res: Any) -> Accepted:
    return Accepted(run_id=res[0], code=AcceptCode(int(res[1])))


async def accept_async(
    r: aioredis.Redis, msg: InboundMessage, *, mode: QueueMode = "followup",
    message_id: str | None = None,
) -> Accepted:
    """Gateway side of :func:`accept`."""
    k, a = _accept_args(msg, mode, message_id)
    return _accepted(await r.eval(lua("accept"), len(k), *k, *a))


def accept(
    r: redis.Redis, msg: InboundMessage, *, mode: QueueMode = "followup",
    message_id: str | None = None,
) -> Accepted:
    """Durably queue ``msg`` and create its run record, in one atomic step.

    With ``message_id``, a message already accepted under that id in the conversation is not
    queued again (``duplicate``, with the first run's id). ``reject`` mode refuses while the
    conversation is busy; ``steer`` mode hands the message to the active turn.
    """
    k, a = _accept_args(msg, mode, message_id)
    return _accepted(r.eval(lua("accept"), len(k), *k, *a))


def _stop_keys(conv: str) -> list[str]:
    return [keys.active(conv), keys.inbox(conv), keys.queued_index(), keys.steer(conv)]


def _stopped(res: Any) -> Stopped:
    return Stopped(res[0] or None, [InboundMessage.model_validate_json(m) for m in res[1:]])


async def stop_async(r: aioredis.Redis, conv: str, reason: str = "stop") -> Stopped:
    """Cancel the active turn (cooperatively: its worker winds down) and clear the queue."""
    res = await r.eval(lua("stop"), 4, *_stop_keys(conv), reason, conv)
    return _stopped(res)


class TurnLease:
    """One worker's hold on one conversation's active turn."""

    def __init__(self, r: redis.Redis, conv: str, turn_id: str, worker: str, lease_s: float):
        self._r = r
        self.conv = conv
        self.turn_id = turn_id
        self.worker = worker
        self.lease_ms = int(lease_s * 1000)

    def renew(self) -> tuple[bool, str]:
        """Extend the lease. Returns (still held, cancellation reason or "")."""
        res: Any = self._r.eval(
            lua("renew"), 2, keys.active(self.conv), keys.active_index(),
            self.turn_id, self.worker, self.lease_ms, now_ms(), self.conv,
        )
        return int(res[0]) > 0, (res[1] if int(res[0]) == 2 else "")

    def take_steered(self) -> list[InboundMessage]:
        """Messages steered into this turn since the last call (steer mode)."""
        res: Any = self._r.eval(
            lua("take_steer"), 2, keys.active(self.conv), keys.steer(self.conv),
            self.turn_id, self.worker,
        )
        return [InboundMessage.model_validate_json(m) for m in res]

    def park(self, until_s: float) -> bool:
        """Give the worker back while the turn waits on a fan-out; the conversation stays
        taken until ``until_s`` seconds from now (then the reaper recovers it)."""
        until = now_ms() + int(until_s * 1000)
        res = self._r.eval(lua("park"), 2, keys.active(self.conv), keys.active_index(),
                           self.turn_id, self.worker, until, self.conv)
        return int(res) == 1

    def begin_delivery(self) -> int:
        """Before sending to a platform: 1 to go ahead, -1 fenced, -2 cancelled (/stop)."""
        return int(self._r.eval(
            lua("begin_delivery"), 1, keys.active(self.conv), self.turn_id, self.worker,
        ))

    def finish(
        self, record: RunRecord, history: list[str], history_cap: int, *, deliver: bool
    ) -> int:
        """Write ``record`` and ``history`` and release the conversation, atomically.

        Returns the number of messages waiting, -1 if this turn was fenced (nothing written),
        or -2 if ``deliver`` lost the race with a cancellation (nothing written).
        """
        conv = self.conv
        return int(
            self._r.eval(
                lua("finish"), 7,
                keys.active(conv), keys.inbox(conv), keys.run(record.run_id), keys.history(conv),
                keys.active_index(), keys.queued_index(), keys.steer(conv),
                self.turn_id, self.worker, record.model_dump_json(), keys.RUN_TTL_SECONDS,
                history_cap, conv, now_ms(), "deliver" if deliver else "close", *history,
            )
        )


def unpark(
    r: redis.Redis, conv: str, turn_id: str, worker: str, lease_s: float
) -> tuple[Claim, TurnLease] | None:
    """Take back a turn parked on a fan-out (its callback runs on ``worker``)."""
    res: Any = r.eval(lua("unpark"), 2, keys.active(conv), keys.active_index(),
                      turn_id, worker, int(lease_s * 1000), now_ms(), conv)
    if not res:
        return None
    msg = InboundMessage.model_validate_json(res[0])
    return Claim("claimed", [msg], res[1]), TurnLease(r, conv, turn_id, worker, lease_s)


def claim(
    r: redis.Redis, conv: str, worker: str, lease_s: float, *, collect: bool = False
) -> tuple[Claim, TurnLease | None]:
    """Try to become the conversation's active turn (popping the inbox head, or all of it)."""
    res: Any = r.eval(
        lua("claim"), 4,
        keys.active(conv), keys.inbox(conv), keys.active_index(), keys.queued_index(),
        worker, int(lease_s * 1000), now_ms(), conv, "1" if collect else "0",
    )
    kind = res[0]
    if kind in ("busy", "empty"):
        return Claim(kind), None
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
    return int(r.eval(lua("push_front"), 2, keys.inbox(conv), keys.queued_index(),
                      msg.model_dump_json(), conv, now_ms()))
