"""Approvals: a tool call waiting for a person, durable in Redis, answered once, fleet-wide.

A turn whose model calls a tool that needs approval parks (its worker is given back) and
:func:`ask` records the request. Whoever answers first wins (:func:`decide`, one Lua script):
an owner through a chat button or ``/approve ID`` / ``/deny ID``, an operator through
``POST /v1/approvals/{id}``, the reaper when the wait times out (``expired``), or ``/stop``
(``cancelled``). The decision is then handed to the parked turn by a task on any worker
(``fermix.approvals.resume``); until the turn has taken it, the approval stays in the
``deciding`` index, so a lost task is sent again by the reaper. Nothing lives in a process:
a worker or gateway restart loses no pending approval.

Keys (:mod:`fermix_shared.keys`): ``fx:approval:{id}`` (hash: ``request`` JSON, ``conv``,
``status``, ``decided_by``, ``reason``, ``decided_at``), ``fx:approvals:pending`` (id ->
expiry ms), ``fx:approvals:by_conv`` (conv -> pending id), ``fx:approvals:deciding`` (id ->
decided at ms).
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

import redis
import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from fermix_shared import keys, lua
from fermix_shared.models import ConversationKey

ApprovalStatus = Literal["pending", "approved", "denied", "expired", "cancelled"]
DECISIONS: tuple[ApprovalStatus, ...] = ("approved", "denied", "expired", "cancelled")
# Records are kept this long after they are asked (the answer and who gave it, for audit).
RECORD_TTL_SECONDS = 7 * 24 * 3600
# Approval ids: 8 lowercase hex characters, short enough to type after /approve.
ID_LENGTH = 8


def new_approval_id() -> str:
    return secrets.token_hex(ID_LENGTH // 2)


def valid_id(value: str) -> bool:
    return len(value) == ID_LENGTH and all(c in "0123456789abcdef" for c in value)


class ApprovalRequest(BaseModel):
    """What is asked: which call of which turn, and where the question went."""

    approval_id: str
    conv: str
    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Who the turn runs for ("telegram:123", "http:api"), and the chat the question was put in.
    requester: str = ""
    ask_in: ConversationKey | None = None
    requested_at: float
    expires_at: float
    # Why it is asked when not for the tool's own rule (the taint check); "" otherwise.
    reason: str = ""


class Approval(BaseModel):
    """A request and, once answered, its answer."""

    request: ApprovalRequest
    status: ApprovalStatus = "pending"
    decided_by: str | None = None
    reason: str = ""
    decided_at: float | None = None

    @property
    def approval_id(self) -> str:
        return self.request.approval_id

    def mark(self) -> str:
        """What the turn's loop records for the call (``LoopState.approvals``)."""
        if self.status == "approved":
            return "approved"
        why = {
            "denied": f"denied by {self.decided_by}" + (f": {self.reason}" if self.reason else ""),
            "expired": "no answer came in time",
            "cancelled": "the request was stopped",
            "pending": "no answer yet",
        }[self.status]
        return f"denied: {why}"


def _approval(raw: dict[str, Any]) -> Approval | None:
    if not raw or "request" not in raw:
        return None
    decided_at = raw.get("decided_at")
    return Approval(
        request=ApprovalRequest.model_validate_json(raw["request"]),
        status=raw.get("status", "pending"),
        decided_by=raw.get("decided_by") or None,
        reason=raw.get("reason", ""),
        decided_at=float(decided_at) / 1000 if decided_at else None,
    )


def _ask_args(req: ApprovalRequest) -> dict[str, lua.Arg]:
    return {
        "record": keys.approval(req.approval_id), "pending": keys.approvals_pending(),
        "by_conv": keys.approvals_by_conv(), "approval_id": req.approval_id,
        "request": req.model_dump_json(), "expires_ms": int(req.expires_at * 1000),
        "conv": req.conv, "ttl_s": RECORD_TTL_SECONDS,
    }


def ask(r: redis.Redis, req: ApprovalRequest) -> None:
    """Record ``req`` as pending (it replaces the conversation's earlier pending one)."""
    lua.APPROVAL_ASK(r, **_ask_args(req))


def _decide_args(approval_id: str, status: ApprovalStatus, by: str, reason: str
                 ) -> dict[str, lua.Arg]:
    if status not in DECISIONS:
        raise ValueError(f"not a decision: {status}")
    return {
        "record": keys.approval(approval_id), "pending": keys.approvals_pending(),
        "by_conv": keys.approvals_by_conv(), "deciding": keys.approvals_deciding(),
        "approval_id": approval_id, "status": status, "decided_by": by, "reason": reason,
        "now_ms": int(time.time() * 1000),
    }


DecideResult = Literal["decided", "already", "unknown"]
_DECIDE_CODES: dict[int, DecideResult] = {1: "decided", 0: "already", -1: "unknown"}


def decide(r: redis.Redis, approval_id: str, status: ApprovalStatus, by: str,
           reason: str = "") -> DecideResult:
    """Answer a pending approval: ``decided`` (this answer counts: send the resume task),
    ``already`` (someone answered first) or ``unknown``."""
    return _DECIDE_CODES[int(lua.APPROVAL_DECIDE(r, **_decide_args(approval_id, status, by,
                                                                   reason)))]


async def decide_async(r: aioredis.Redis, approval_id: str, status: ApprovalStatus, by: str,
                       reason: str = "") -> DecideResult:
    return _DECIDE_CODES[int(await lua.APPROVAL_DECIDE(
        r, **_decide_args(approval_id, status, by, reason)))]


def get(r: redis.Redis, approval_id: str) -> Approval | None:
    raw: Any = r.hgetall(keys.approval(approval_id))
    return _approval({_s(k): _s(v) for k, v in raw.items()})


async def get_async(r: aioredis.Redis, approval_id: str) -> Approval | None:
    raw: Any = await r.hgetall(keys.approval(approval_id))
    return _approval({_s(k): _s(v) for k, v in raw.items()})


async def pending_for_conv_async(r: aioredis.Redis, conv: str) -> str | None:
    """The conversation's pending approval id, if its turn waits on one."""
    value: Any = await r.hget(keys.approvals_by_conv(), conv)
    return None if value is None else _s(value)


async def pending_async(r: aioredis.Redis, limit: int = 100) -> list[Approval]:
    """Pending approvals, soonest expiry first."""
    ids: Any = await r.zrange(keys.approvals_pending(), 0, limit - 1)
    out = []
    for raw_id in ids:
        found = await get_async(r, _s(raw_id))
        if found is not None and found.status == "pending":
            out.append(found)
    return out


def expired(r: redis.Redis, now_s: float, limit: int = 100) -> list[str]:
    """Pending approvals whose wait is over (the reaper denies them)."""
    ids: Any = r.zrangebyscore(keys.approvals_pending(), "-inf", int(now_s * 1000),
                               start=0, num=limit)
    return [_s(x) for x in ids]


def unresumed(r: redis.Redis, older_than_s: float, now_s: float, limit: int = 100) -> list[str]:
    """Answered approvals whose turn has not taken the answer ``older_than_s`` after it came
    (its resume task was lost): the reaper sends it again."""
    cutoff = int((now_s - older_than_s) * 1000)
    ids: Any = r.zrangebyscore(keys.approvals_deciding(), "-inf", cutoff, start=0, num=limit)
    return [_s(x) for x in ids]


def taken(r: redis.Redis, approval_id: str) -> None:
    """The parked turn has the answer (or is gone): stop watching the approval."""
    r.zrem(keys.approvals_deciding(), approval_id)


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
