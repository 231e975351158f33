"""The approvals API (operators): what waits for a person, and answering it.

``GET /v1/approvals``: pending approvals, soonest expiry first. ``GET /v1/approvals/{id}``: one,
answered or not. ``POST /v1/approvals/{id}`` with ``{"decision": "approve"|"deny",
"reason"?}``: answer it (200 with the approval; 409 when it was answered already, with who
answered; 404 for an unknown id). The token holder answers as ``http:api``.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from fermix_gateway import approval_answers as answers
from fermix_gateway.api.run_bodies import Approval as ApprovalBody
from fermix_gateway.api.run_bodies import ApprovalConflict, Approvals
from fermix_gateway.api.schemas import ms
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Operator
from fermix_gateway.inbound import task_sender
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import Approval
from fermix_shared.task_names import APPROVAL_RESUME_TASK

router = v1_router()
NO_APPROVAL = {404: "No such approval."}


class ApprovalAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    decision: Literal["approve", "deny"]
    reason: str = Field(default="", max_length=500)


def approval_json(a: Approval) -> dict[str, Any]:
    req = a.request
    out: dict[str, Any] = {
        "id": req.approval_id, "status": a.status, "tool": req.tool, "arguments": req.arguments,
        "runId": req.run_id, "callId": req.call_id, "conversation": req.conv,
        "requester": req.requester, "requestedAt": ms(req.requested_at),
        "expiresAt": ms(req.expires_at),
    }
    if a.status != "pending":
        out.update(decidedBy=a.decided_by, decidedAt=ms(a.decided_at), reason=a.reason)
    return out


async def _get(request: Request, approval_id: str) -> Approval:
    found = None
    if approvals.valid_id(approval_id):
        found = await approvals.get_async(request.app.state.redis, approval_id)
    if found is None:
        raise HTTPException(404, f"no approval {approval_id!r}")
    return found


@router.get("/approvals", response_model=Approvals)
async def list_approvals(request: Request) -> dict[str, Any]:
    waiting = await approvals.pending_async(request.app.state.redis)
    return {"approvals": [approval_json(a) for a in waiting]}


@router.get("/approvals/{approval_id}", response_model=ApprovalBody,
            responses=refusals(NO_APPROVAL))
async def get_approval(approval_id: str, request: Request) -> dict[str, Any]:
    return approval_json(await _get(request, approval_id))


@router.post("/approvals/{approval_id}", response_model=ApprovalBody, responses={
    **refusals(NO_APPROVAL),
    409: {"model": ApprovalConflict, "description": "Answered already: the reason and the approval."}})
async def answer_approval(approval_id: str, body: ApprovalAnswer, request: Request,
                          who: Operator) -> dict[str, Any] | JSONResponse:
    r = request.app.state.redis
    await _get(request, approval_id)
    decision: answers.Decision = "approved" if body.decision == "approve" else "denied"
    result = await approvals.decide_async(r, approval_id, decision, who.actor, body.reason)
    found = await _get(request, approval_id)
    if result == "already":
        return JSONResponse({"error": f"approval {approval_id} was already answered: "
                                      f"{answers.describe(found)}", **approval_json(found)},
                            status_code=409)
    await answers.audit_decision(r, found)
    await task_sender(request)(APPROVAL_RESUME_TASK, [approval_id])
    return approval_json(found)
