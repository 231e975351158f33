"""A turn parked for a person's answer: asking, then taking the answer back.

When the loop meets a call that needs approval (:mod:`~fermix_worker.approvals.policy`) it
checkpoints the call as ``pending`` and returns ``AwaitApproval``. :meth:`ApprovalParking.park`
gives the worker back and asks; once the approval is answered, expires or is cancelled, the
``fermix.approvals.resume`` task comes to :meth:`ApprovalParking.take_answer`, which takes the
parked turn back on whichever worker runs it and records the answer in its checkpoint. The
turn then continues as any resumed turn does (:mod:`~fermix_worker.turn.resume`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fermix_shared import audit
from fermix_shared.approvals import store as approvals
from fermix_shared.messages import ToolCall
from fermix_shared.models import InboundMessage
from fermix_shared.run_events import ApprovalAnswered, ApprovalAsked
from fermix_shared.stores import queue
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Fenced
from fermix_worker.approvals.policy import ApprovalAsker, ApprovalPolicy
from fermix_worker.loop_state import LoopState
from fermix_worker.tools.context import AuditRecorder

if TYPE_CHECKING:  # the turn imports this module: only types come back from it
    from fermix_worker.turn.checkpoints import Checkpoints
    from fermix_worker.turn.events import EventSink
    from fermix_worker.turn.wiring import TurnWiring

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answered:
    """A parked turn taken back with its call's answer in its checkpoint: ``msg`` as its agent
    runs it, the new lease, the state, and whether /stop reached the turn while it waited;
    the call, how long it waited (s) and its answer (the approval's status), for its span."""

    msg: InboundMessage
    lease: TurnLease
    state: LoopState
    cancelled: bool
    call_id: str = ""
    waited_s: float = 0.0
    answer: str = ""


class ApprovalParking:
    """Parks a turn for an approval and takes it back when the answer comes."""

    def __init__(self, wiring: TurnWiring, checkpoints: Checkpoints):
        self._wiring = wiring
        self._r = wiring.redis
        self._checkpoints = checkpoints
        self._asker = ApprovalAsker(wiring.redis, ApprovalPolicy(wiring.settings.approvals),
                                    wiring.channels)

    def park(self, msg: InboundMessage, lease: TurnLease, call: ToolCall, sink: EventSink,
             recorder: AuditRecorder, reason: str = "") -> bool:
        """Checkpointed already (the call's approval is ``pending``): give the worker back,
        then record the request and ask (audited through ``recorder``, the turn's); False
        when the lease was gone (fenced: nothing asked). ``reason``: why it is asked, when not
        for the tool's own rule (the taint check), shown with the question.
        A worker that dies in between leaves a parked turn without a request: its lease lapses
        after the wait and the resumed turn asks again."""
        sink.flush()
        req = self._asker.request(msg, call, reason)
        if not lease.park(self._asker.park_seconds()):
            return False
        self._asker.ask(req)
        args_sha256, args_len = audit.arguments_digest(call.arguments)
        recorder.record("approval", "asked", "ok", approval_id=req.approval_id, tool=call.name,
                        call_id=call.id[:64], args_sha256=args_sha256, args_len=args_len)
        sink.emit(ApprovalAsked(call_id=call.id, tool=call.name, approval_id=req.approval_id,
                                expires_at=int(req.expires_at * 1000), worker=lease.worker))
        return True

    def take_answer(self, approval_id: str, worker: str) -> Answered | Fenced:
        """An approval was answered (or expired, or was cancelled): take the parked turn
        back and record the answer for its call. :class:`Fenced` when there is nothing to
        resume (the turn moved on, was closed, or took this answer already)."""
        found = approvals.get(self._r, approval_id)
        if found is None or found.status == "pending":
            return Fenced()
        req = found.request
        state = self._checkpoints.load(req.run_id)
        if state is None or state.approvals.get(req.call_id) != "pending":
            approvals.taken(self._r, approval_id)
            return Fenced()
        settings = self._wiring.settings
        taken = queue.unpark(self._r, req.conv, req.run_id, worker, settings.lease_seconds)
        if taken is None:
            log.warning("approval %s came back after its turn was closed; dropped", approval_id)
            approvals.taken(self._r, approval_id)
            return Fenced()
        claim, lease = taken
        msg, _ = self._wiring.as_agent(claim.messages[0])
        state = self._checkpoints.load(req.run_id) or state
        state.approvals[req.call_id] = found.mark()
        self._checkpoints.save(state)
        approvals.taken(self._r, approval_id)
        RunEvents(self._r, req.run_id).emit(ApprovalAnswered(
            call_id=req.call_id, approval_id=approval_id, status=found.status,
            decided_by=found.decided_by or "",
        ))
        waited = (found.decided_at or time.time()) - req.requested_at
        return Answered(msg, lease, state, cancelled=bool(claim.cancelled), call_id=req.call_id,
                        waited_s=max(0.0, waited), answer=found.status)
