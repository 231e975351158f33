"""Resuming a turn: a worker takes a turn back from its checkpoint and carries on.

Three ways a turn comes back, each to its own method of :class:`TurnResumer`:

* :meth:`~TurnResumer.after_crash`: its worker died (the dispatcher claimed it as an orphan);
  a reply that may already be in the chat is committed, never sent twice;
* :meth:`~TurnResumer.after_fanout`: the fan-out's callback brings its subagents' result for
  the parked call;
* :meth:`~TurnResumer.after_approval`: a person answered the parked call's approval (or it
  expired, or was cancelled; :mod:`~fermix_worker.approvals.park` takes the answer back).

:meth:`~TurnResumer.close_orphan` ends a dead worker's turn that will not be resumed. Every
resumed turn then proceeds as a started one does (:mod:`~fermix_worker.turn.proceed`).
"""

from __future__ import annotations

import logging

from fermix_shared import tracing
from fermix_shared.models import InboundMessage, RunRecord
from fermix_shared.run_config import verbose_for
from fermix_shared.run_events import RunResuming
from fermix_shared.stores import queue, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Fenced
from fermix_worker.loop import Final, answer_call
from fermix_worker.tools.base import ToolResult
from fermix_worker.turn.events import tool_finished
from fermix_worker.turn.outcome import TurnOutcome
from fermix_worker.turn.proceed import Proceed
from fermix_worker.turn.spans import ended, turn_span
from fermix_worker.turn.wiring import TurnParts

log = logging.getLogger(__name__)


class TurnResumer:
    """Takes turns back after a crash, a fan-out or an approval (module docstring)."""

    def __init__(self, parts: TurnParts, proceed: Proceed):
        self._parts, self._proceed = parts, proceed
        self._wiring, self._r = parts.wiring, parts.wiring.redis

    def after_crash(self, msg: InboundMessage, lease: TurnLease, attempt: int) -> TurnOutcome:
        """Continue a turn whose worker died, from its last checkpoint."""
        parts = self._parts
        msg, _ = self._wiring.as_agent(msg)
        state = parts.checkpoints.load(msg.run_id)
        if state is None:
            return parts.closer.orphan(msg, lease, "")
        if state.final is not None and parts.deliverer.sent_before_a_failover(lease, msg.run_id):
            # Its reply may be in the chat already (a failover lost what followed the send):
            # commit it, never send it twice (delivery.py).
            record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id,
                                                                conversation=msg.key)
            record.worker = lease.worker
            return parts.closer.finish(msg, lease, state, record, Final(state.final),
                                       resend=False)
        log.warning("resuming turn %s (attempt %d) at iteration %d", msg.run_id, attempt, state.iteration)
        RunEvents(self._r, msg.run_id).emit(RunResuming(
            error="the worker running this turn stopped; resuming it on another worker",
        ))
        return self._proceed(msg, lease, state, resumed=True)

    def after_fanout(
        self, conv: str, run_id: str, call_id: str, result: ToolResult, worker: str,
        tool_name: str = "subagents",
    ) -> TurnOutcome:
        """The fan-out's callback: take the parked turn back, answer its call, continue.
        :class:`Fenced` when the turn was no longer parked (it was recovered after its
        deadline)."""
        taken = queue.unpark(self._r, conv, run_id, worker, self._wiring.settings.lease_seconds)
        if taken is None:
            log.warning("fan-out for %s came back after its turn was closed; dropped", run_id)
            return Fenced()
        claim, lease = taken
        msg, _ = self._wiring.as_agent(claim.messages[0])
        with turn_span(msg, lease.worker, "after_fanout") as span:
            return ended(span, self._answer_fanout(msg, lease, claim.cancelled, run_id, call_id,
                                                   result, tool_name))

    def _answer_fanout(self, msg: InboundMessage, lease: TurnLease, cancelled: str, run_id: str,
                       call_id: str, result: ToolResult, tool_name: str) -> TurnOutcome:
        parts = self._parts
        state = parts.checkpoints.load(run_id)
        if state is None:
            return parts.closer.orphan(msg, lease, cancelled)
        if cancelled:
            return parts.closer.stopped(msg, lease, state.merged_runs)
        answer_call(state, call_id, result)
        parts.checkpoints.save(state)
        RunEvents(self._r, run_id).emit(tool_finished(
            tool_name, call_id, result, verbose=verbose_for(msg, self._wiring.settings.runs)))
        return self._proceed(msg, lease, state, resumed=True)

    def after_approval(self, approval_id: str, worker: str) -> TurnOutcome:
        """An approval was answered (or expired, or was cancelled): take the parked turn
        back with the answer for its call, continue. :class:`Fenced` when there is nothing
        to resume (the turn moved on, was closed, or took this answer already). The turn's
        span, and the approved call's tool span, say how long the call waited."""
        answered = self._parts.approvals.take_answer(approval_id, worker)
        if isinstance(answered, Fenced):
            return answered
        msg, lease, state = answered.msg, answered.lease, answered.state
        with turn_span(msg, lease.worker, "after_approval") as span, tracing.approval_wait(
                answered.call_id, answered.waited_s, answered.answer):
            span.set_attributes(tracing.waited_for_approval(answered.call_id))
            if answered.cancelled:
                return ended(span, self._parts.closer.stopped(msg, lease, state.merged_runs))
            return ended(span, self._proceed(msg, lease, state, resumed=True))

    def close_orphan(self, msg: InboundMessage, lease: TurnLease, cancelled: str) -> TurnOutcome:
        """A turn whose worker died and that will not be resumed."""
        return self._parts.closer.orphan(msg, lease, cancelled)
