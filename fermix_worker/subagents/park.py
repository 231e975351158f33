"""A subagent parked for a person's approval: its job gives its worker back, not the parent.

When a subagent's loop meets a call that needs approval (``[approvals]``, or the taint check)
the runner asks as a parked turn does (the request is recorded, the question goes to the
parent turn's chat, or waits for ``POST /v1/approvals/{id}``), keeps the subagent's loop state
in its claim (:meth:`~fermix_worker.subagents.claim.SubagentClaim.park`), gives its
concurrency slot back and ends its header task with a retry: the task looks again every
:data:`PARK_POLL_S` (one cheap task run each time, no worker held meanwhile) and, once the
answer is in, takes a slot and goes on from the parked state with the call approved or denied.
The parent turn stays parked on its fan-out all along, and its deadline bounds the wait: the
approval expires :data:`ANSWER_RESERVE_S` before the fan-out's deadline at the latest, so the
subagent can still go on with the denial. When the parent is stopped (``/stop``, its agent
killed) or the deadline passes, the next look withdraws the approval (cancelled, expired) and
reports the subagent cancelled or timed out: the chord completes once, as always.

A skill run inside a subagent (:mod:`~fermix_worker.subagents.inline_skill`) and a run without
a claim cannot park: their calls that need approval are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis

from fermix_shared import audit
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.channels.base import OutboundChannel
from fermix_shared.messages import ToolCall
from fermix_shared.models import Channel
from fermix_shared.records import VersionedRecord
from fermix_shared.run_events import ApprovalAnswered, ApprovalAsked
from fermix_shared.settings import Settings
from fermix_shared.stores.events import RunEvents
from fermix_worker.approvals.policy import ApprovalAsker, ApprovalPolicy, plain_arguments
from fermix_worker.loop_state import LoopState
from fermix_worker.subagents.claim import SubagentClaim, Superseded
from fermix_worker.subagents.job import SubagentJob
from fermix_worker.subagents.results import cut_utf8
from fermix_worker.tools.context import AuditRecorder

PARKED_SCHEMA_VERSION = 1
# How often a parked subagent's header task looks for its answer (jittered by the task).
PARK_POLL_S = 1.0
# An answered subagent waiting for a free slot of its fan-out looks again this soon.
SLOT_POLL_S = 0.5
# A subagent's approval expires this long before its fan-out's deadline at the latest.
ANSWER_RESERVE_S = 30.0
ASKED_BY = "Asked by {who} of this conversation's turn, working on: {task}"
TASK_ECHO_BYTES = 160
LOST = "denied: the approval request was lost"
WAITED_PAST_DEADLINE = (
    "the subagent was still waiting for an approval when its fan-out's time ran out")


class ParkedSubagent(VersionedRecord):
    """A subagent waiting for an approval, as its claim keeps it (any worker resumes it)."""

    SCHEMA_VERSION = PARKED_SCHEMA_VERSION

    approval_id: str
    # The loop's id of the call that waits (the request's id is prefixed: see ``_request``).
    call_id: str
    state: LoopState
    # Seconds the subagent ran before it parked (its per-worker timeout counts run time only)
    # and when it first started (its report's start).
    used_s: float
    started_at: float


@dataclass(frozen=True)
class Asking:
    """The subagent's loop stopped at a call that needs approval (the runner parks it)."""

    state: LoopState
    call: ToolCall
    reason: str
    used_s: float


@dataclass(frozen=True)
class Parked:
    """The subagent is parked: its header task retries with ``park_token`` after ``retry_s``."""

    park_token: str
    retry_s: float


class SubagentParking:
    """Asks for a subagent's approval, parks it, and hands it the answer."""

    def __init__(self, r: redis.Redis, settings: Settings,
                 channels: Callable[[Channel], OutboundChannel | None] | None = None):
        self._r = r
        self._policy = ApprovalPolicy(settings.approvals)
        self._asker = ApprovalAsker(r, self._policy, channels or (lambda channel: None))

    def park(self, job: SubagentJob, claim: SubagentClaim, asking: Asking, started_at: float,
             worker: str, recorder: AuditRecorder) -> Parked | Superseded:
        """Keep the subagent in ``claim`` (which this execution holds), then ask."""
        req = self._request(job, asking)
        parked = ParkedSubagent(approval_id=req.approval_id, call_id=asking.call.id,
                                state=asking.state, used_s=asking.used_s, started_at=started_at)
        token = claim.park(parked.model_dump_json())
        if token is None:
            return Superseded()
        self._asker.ask(req)
        args_sha256, args_len = audit.arguments_digest(asking.call.arguments)
        recorder.record("approval", "asked", "ok", approval_id=req.approval_id,
                        tool=asking.call.name, call_id=req.call_id[:64],
                        args_sha256=args_sha256, args_len=args_len)
        RunEvents(self._r, job.parent_run).emit(ApprovalAsked(
            call_id=req.call_id, tool=asking.call.name, approval_id=req.approval_id,
            expires_at=int(req.expires_at * 1000), worker=worker))
        return Parked(token, PARK_POLL_S)

    def _request(self, job: SubagentJob, asking: Asking) -> ApprovalRequest:
        now = time.time()
        task, cut = cut_utf8(" ".join(job.task.split()), TASK_ECHO_BYTES)
        who = f"the skill run '{job.skill}'" if job.skill else f"subagent {job.index + 1}"
        why = ASKED_BY.format(who=who, task=task + ("…" if cut else ""))
        latest = max(now + 1.0, job.deadline_at - ANSWER_RESERVE_S)
        return ApprovalRequest(
            approval_id=approvals.new_approval_id(), conv=job.conv, run_id=job.parent_run,
            # Unique within the parent run, and never one of the parent's own calls.
            call_id=f"sub{job.index}:{asking.call.id}", tool=asking.call.name,
            arguments=plain_arguments(asking.call.arguments), requester=job.parent_user,
            ask_in=job.ask_in, requested_at=now,
            expires_at=min(now + self._policy.timeout_s, latest),
            reason=f"{asking.reason}\n{why}" if asking.reason else why,
        )

    def answer(self, parked: ParkedSubagent) -> str | None:
        """The waiting call's mark once answered (``approved``, ``denied: ...``); None while
        it waits."""
        found = approvals.get(self._r, parked.approval_id)
        if found is None:
            return LOST
        return None if found.status == "pending" else found.mark()

    def took(self, job: SubagentJob, parked: ParkedSubagent) -> None:
        """The subagent goes on with its answer: nothing waits for it any more."""
        approvals.taken(self._r, parked.approval_id)
        found = approvals.get(self._r, parked.approval_id)
        if found is not None:
            RunEvents(self._r, job.parent_run).emit(ApprovalAnswered(
                call_id=found.request.call_id, approval_id=parked.approval_id,
                status=found.status, decided_by=found.decided_by or ""))

    def withdraw(self, job: SubagentJob, parked: ParkedSubagent,
                 status: Literal["cancelled", "expired"], why: str) -> None:
        """The subagent will not go on (its parent stopped, its deadline passed): nobody is
        asked any more."""
        by = "timeout" if status == "expired" else "subagent"
        if approvals.decide(self._r, parked.approval_id, status, by, why) == "decided":
            found = approvals.get(self._r, parked.approval_id)
            audit.record(self._r, "approval", status, "ok", actor=by, run_id=job.parent_run,
                         conv=job.conv, approval_id=parked.approval_id,
                         tool=found.request.tool if found else None)
        approvals.taken(self._r, parked.approval_id)

