"""Answering approvals from the gateway: ``/approve ID``, ``/deny ID [reason]``, chat buttons,
``POST /v1/approvals/{id}``, and ``/stop`` (which cancels the conversation's pending one).

Only operators answer (owners in chats, token holders over HTTP); the first answer wins (one
Lua script, :mod:`fermix_shared.approvals.store`), and a winning answer sends
``fermix.approvals.resume`` so any worker continues the parked turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

import redis.asyncio as aioredis

from fermix_shared import audit
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import Approval
from fermix_shared.task_names import APPROVAL_RESUME_TASK

# Sends a Celery task by name (the gateway never imports the worker).
SendTask = Callable[[str, list[str]], Awaitable[None]]
Decision = Literal["approved", "denied"]
GUEST_REFUSAL = "Sorry, only the owner can answer approvals."


def describe(found: Approval) -> str:
    """How an answered approval reads: "approved by telegram:1", "denied (no answer...)"."""
    if found.status == "expired":
        return "denied: no answer came in time"
    if found.status == "cancelled":
        return "cancelled (the request was stopped)"
    why = f": {found.reason}" if found.reason else ""
    return f"{found.status} by {found.decided_by}{why}"


async def answer(r: aioredis.Redis, send: SendTask, approval_id: str, decision: Decision,
                 by: str, reason: str = "") -> str:
    """Record an operator's answer and resume the turn; the sentence to show them."""
    approval_id = approval_id.strip().lower()
    if not approvals.valid_id(approval_id):
        return f"No approval with id {approval_id!r} (ids are 8 characters, as in the request)."
    result = await approvals.decide_async(r, approval_id, decision, by, reason)
    found = await approvals.get_async(r, approval_id)
    if result == "unknown" or found is None:
        return f"No approval with id {approval_id}."
    if result == "already":
        return f"Approval {approval_id} was already answered: {describe(found)}."
    await audit_decision(r, found)
    await send(APPROVAL_RESUME_TASK, [approval_id])
    verb = "Approved" if decision == "approved" else "Denied"
    return f"{verb} {approval_id}: `{found.request.tool}`" + (
        " will run now." if decision == "approved" else " will not run.")


async def cancel_pending(r: aioredis.Redis, send: SendTask, conv: str, by: str) -> bool:
    """/stop: cancel the conversation's pending approval (its turn then ends stopped at once
    instead of waiting for the answer). True when there was one."""
    approval_id = await approvals.pending_for_conv_async(r, conv)
    if approval_id is None:
        return False
    if await approvals.decide_async(r, approval_id, "cancelled", by) != "decided":
        return False
    if (found := await approvals.get_async(r, approval_id)) is not None:
        await audit_decision(r, found)
    await send(APPROVAL_RESUME_TASK, [approval_id])
    return True


async def audit_decision(r: aioredis.Redis, found: Approval) -> None:
    """The audit entry of a decision (approved, denied, cancelled) this gateway recorded; a
    person's reason is kept as its digest."""
    req = found.request
    await audit.arecord(r, "approval", found.status, "ok", actor=found.decided_by or "",
                        run_id=req.run_id, conv=req.conv, approval_id=req.approval_id,
                        tool=req.tool, call_id=req.call_id[:64],
                        reason_sha256=audit.text_digest(found.reason) if found.reason else None)


async def pending_text(r: aioredis.Redis, conv: str | None = None) -> str:
    """``/approve`` without an id: what waits (here first)."""
    waiting = await approvals.pending_async(r)
    if conv is not None:
        waiting.sort(key=lambda a: a.request.conv != conv)
    if not waiting:
        return "No approvals are waiting."
    lines = [f"{a.approval_id}: `{a.request.tool}` in {a.request.conv}" for a in waiting[:10]]
    return "Waiting for approval:\n" + "\n".join(lines) + "\nAnswer /approve ID or /deny ID."
