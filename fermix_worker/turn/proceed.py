"""Proceed: a held turn with a ready state runs its loop, then parks or closes.

Starting a turn (:mod:`~fermix_worker.turn.start`) and resuming one
(:mod:`~fermix_worker.turn.resume`) both end here once the turn's state is checkpointed: the
run is marked ``running`` (its start event says whether it resumed), the loop runs under the
lease (:class:`~fermix_worker.turn.drive.TurnDriver`), and what it returned decides the rest:
a fan-out or an approval parks the turn (the worker is free until the answer comes), /stop
or a final answer or failure closes it (:mod:`~fermix_worker.turn.close`), a lost lease
writes nothing.
"""

from __future__ import annotations

from fermix_shared import audit, tracing
from fermix_shared.agents.definitions import turn_agent
from fermix_shared.logs import log_context
from fermix_shared.messages import ToolCall
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.run_config import verbose_for
from fermix_shared.run_events import RunStarted, SubagentsStarted
from fermix_shared.stores import runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Fenced
from fermix_shared.usage.scopes import user_of
from fermix_worker.loop import AwaitApproval, AwaitSubagents, Failed, Final
from fermix_worker.loop_state import LoopState
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.turn.drive import Cancelled, LeaseGone, tool_scope
from fermix_worker.turn.events import EventSink
from fermix_worker.turn.lease import turn_deadline
from fermix_worker.turn.outcome import Parked, TurnOutcome
from fermix_worker.turn.wiring import TurnParts


class Proceed:
    """Runs a held turn from its checkpointed state to a park or its end (module docstring)."""

    def __init__(self, parts: TurnParts):
        self._parts = parts
        self._r = parts.wiring.redis
        self._settings = parts.wiring.settings

    def __call__(self, msg: InboundMessage, lease: TurnLease, state: LoopState, *,
                 resumed: bool, read: RunRecord | None = None) -> TurnOutcome:
        """Run the turn on from ``state``. ``read``: the run's record as the caller read it
        since the claim (a new turn's reads), else it is read here."""
        with log_context(run_id=msg.run_id, conversation=msg.key.as_str(), agent=msg.agent,
                         worker=lease.worker):
            return self._run(msg, lease, state, resumed=resumed, read=read)

    def _run(self, msg: InboundMessage, lease: TurnLease, state: LoopState, *,
             resumed: bool, read: RunRecord | None) -> TurnOutcome:
        parts = self._parts
        events = RunEvents(self._r, msg.run_id)
        with tracing.span("fermix.run_start"):
            record = read or runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id,
                                                                        conversation=msg.key)
            record.status, record.worker = RunStatus.running, lease.worker
            record.started_at = record.started_at or now()
            # The run names its trace (GET /v1/runs/{id}), as the turn's spans name the run.
            record.trace_id = record.trace_id or tracing.current_trace_id()
            with self._r.pipeline(transaction=False) as pipe:  # the record, then its event
                runs.put(pipe, record)
                events.emit(RunStarted(started_at=record.started_at, resumed=resumed), pipe)
                pipe.execute()
        live = parts.deliverer.live(msg)  # None unless the reply streams into a chat
        sink = EventSink(events, listener=live, verbose=verbose_for(msg, self._settings.runs),
                         thinking=turn_agent(self._settings.agents, msg.agent).stream_thinking)
        deadline = turn_deadline(msg, record.started_at, self._settings)
        # Who acts, for the audit entries of the turn's tool calls, checks and parks.
        acting = audit.recorder(self._r, audit.who(msg), trust=msg.trust)
        try:
            result = parts.driver.run(msg, lease, state, sink, deadline, acting)
            if live is not None:  # done streaming: the final delivery takes over
                sink.flush()
                live.close(parked=isinstance(result, AwaitSubagents | AwaitApproval))
        finally:
            if live is not None:
                live.close()
        match result:
            case AwaitSubagents(call=call):
                return self._fan_out(msg, lease, state, call, sink, acting)
            case AwaitApproval(call=call, reason=reason):
                parked = parts.approvals.park(msg, lease, call, sink, acting, reason)
                return Parked() if parked else Fenced()
            case Cancelled():
                return parts.closer.stopped(msg, lease, state.merged_runs)
            case LeaseGone():
                return Fenced()
            case Final() | Failed() as result:
                sink.flush()
                with tracing.span("fermix.finish"):
                    return parts.closer.finish(msg, lease, state, record, result)

    def _fan_out(self, msg: InboundMessage, lease: TurnLease, state: LoopState, call: ToolCall,
                 sink: EventSink, acting: audit.Recorder) -> TurnOutcome:
        """Checkpointed already: give the worker back and start the fan-out (its callback
        resumes the turn: :meth:`~fermix_worker.turn.resume.TurnResumer.after_fanout`)."""
        fanout = self._parts.wiring.fanout
        sink.flush()
        if not lease.park(fanout.deadline(call, msg.profile)):
            return Fenced()
        sink.emit(SubagentsStarted(call_id=call.id, worker=lease.worker))
        # The subagents get the parked turn's tools, never more (subagents/registry.py).
        fanout.launch(FanOutRequest(
            run_id=msg.run_id, conv=msg.key.as_str(), call=call, trust=msg.trust,
            profile=msg.profile, model=state.model,
            scope=tool_scope(msg, turn_agent(self._settings.agents, msg.agent)), agent=msg.agent,
            user=user_of(msg), deliver_to=msg.deliver_to,
        ), acting)
        return Parked()
