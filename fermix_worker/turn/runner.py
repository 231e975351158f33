"""TurnRunner: a claimed turn through its four phases — prepare, run, deliver, commit.

Entry points, one per way a worker comes to hold a turn: :meth:`run` (a new message),
:meth:`resume` (a turn whose worker died, from its checkpoint), :meth:`resume_fanout` (a
parked turn, when its fan-out's results arrive), :meth:`compact_turn` (a compaction job in the
conversation's order) and :meth:`close_orphan`. Each returns a
:data:`~fermix_worker.turn.outcome.TurnOutcome`.

Prepare is :func:`~fermix_worker.turn.prepare.prepare` (pure) over what this module gathers;
run is :class:`~fermix_worker.turn.drive.TurnDriver`; deliver and commit (one atomic step) and
every other way a turn ends are in :mod:`fermix_worker.turn.close`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import redis

from fermix_shared import audit
from fermix_shared.agents.definitions import AgentDefinition, as_agent
from fermix_shared.approvals import store as approvals
from fermix_shared.hooks import HookRegistry
from fermix_shared.logs import log_context
from fermix_shared.memory import MemoryStore, load_prompt_memory, memory_section
from fermix_shared.messages import ToolCall
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.redis.durability import DeliveryWait
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry, skills_section
from fermix_shared.stores import history, queue, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease_results import Fenced, Released, StopWon
from fermix_shared.stores.queue import TurnLease
from fermix_shared.usage.budgets import BudgetStatus, describe, refusal_text
from fermix_shared.usage.scopes import user_of
from fermix_worker.approvals.policy import ApprovalAsker, ApprovalPolicy
from fermix_worker.compaction import POST_TURN_NOTICE, PREFLIGHT_NOTICE
from fermix_worker.compaction.conversation import Compacted, CompactionFailed, ConversationCompactor
from fermix_worker.compaction.step import CompactionStep
from fermix_worker.loop import AwaitApproval, AwaitSubagents, Failed, Final, LoopState, answer_call
from fermix_worker.providers import RoutedProvider
from fermix_worker.providers.routes import chain_from_settings
from fermix_worker.subagents.contract import FanOut, FanOutRequest, NoFanOut
from fermix_worker.tools.base import ToolRegistry, ToolResult
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.close import TurnCloser
from fermix_worker.turn.delivery import ChannelLookup, Deliverer
from fermix_worker.turn.drive import Cancelled, LeaseGone, TurnDriver, tool_scope
from fermix_worker.turn.events import EventSink, emit_end
from fermix_worker.turn.lease import LeaseKeeper, turn_deadline
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.turn.live_reply import LiveReplies
from fermix_worker.turn.outcome import Delivered, Parked, TurnOutcome
from fermix_worker.turn.prepare import PromptOverride, TurnInputs, merge_texts, prepare
from fermix_worker.usage.budgets import BudgetGate

log = logging.getLogger(__name__)


class TurnRunner:
    def __init__(
        self,
        r: redis.Redis,
        settings: Settings,
        tools: ToolRegistry,
        router: Callable[[], RoutedProvider],
        channels: ChannelLookup = lambda name: None,
        hooks: HookRegistry | None = None,
        fanout: FanOut | None = None,
        listeners: TurnListeners | None = None,
        skills: SkillRegistry | None = None,
    ):
        self._r = r
        self._settings = settings
        self._hooks = hooks or HookRegistry()
        self._fanout = fanout or NoFanOut()
        self._checkpoints = Checkpoints(r)
        deliverer = Deliverer(channels, self._hooks, settings.history_limit,
                              LiveReplies(r, settings, channels),
                              DeliveryWait(r, settings.wait_rule(), settings.redis_wait_timeout_ms))
        self._deliverer = deliverer
        self._compaction = CompactionStep(
            r, settings, ConversationCompactor(r, settings, router), self._hooks, deliverer.notice)
        self._driver = TurnDriver(settings, tools, router, self._hooks, self._checkpoints,
                                  self._compaction, deliverer.working)
        self._closer = TurnCloser(r, settings, deliverer, listeners or TurnListeners(),
                                  self._checkpoints)
        self._memory = MemoryStore(r)
        self._skills = skills
        self._budgets = BudgetGate(r, settings)
        self._asker = ApprovalAsker(r, ApprovalPolicy(settings.approvals), channels)
        # Memory files are read once per process (restart workers after editing them).
        self._memory_files = load_prompt_memory(settings.home)

    def _as_agent(self, msg: InboundMessage) -> tuple[InboundMessage, AgentDefinition]:
        """The message as its agent runs it (trust and tools narrowed), and the agent."""
        agent = self._settings.turn_agent(msg.agent)
        return as_agent(msg, agent), agent

    def _prompt_base(self, agent: AgentDefinition) -> str:
        """The agent's system prompt (the configured one unless it has its own), then the
        memory files."""
        system = agent.system_prompt or self._settings.system_prompt
        return "\n\n".join(p for p in (system, self._memory_files) if p)

    # -- prepare ---------------------------------------------------------------------------

    def run(self, messages: list[InboundMessage], lease: TurnLease) -> TurnOutcome:
        """Run the claimed turn (messages[0], plus any merged into it)."""
        msg, agent = self._as_agent(messages[0])
        messages = [msg, *messages[1:]]
        conv = msg.key.as_str()
        # Budgets first: a refused turn calls no model, not even for preflight compaction.
        over_budget = self._budgets.blocking(msg)
        agent_gone = self._job_agent_gone(msg)
        if over_budget is None and agent_gone is None and self._compaction.needed(conv):
            with LeaseKeeper(lease, self._settings.cancel_poll_seconds):
                self._compaction.compact(msg, PREFLIGHT_NOTICE, reason="preflight")
        state = prepare(self._inputs(messages, agent))
        # Checkpoint first: from here on, a worker that dies leaves a resumable turn.
        self._checkpoints.save(state)
        history.append(self._r, conv, [state.messages[-1]])
        if over_budget is not None:
            return self._refuse(msg, lease, state, over_budget)
        if agent_gone is not None:
            return self._closer.finish(msg, lease, state, self._started(msg, lease), agent_gone)
        return self._drive(msg, lease, state, resumed=False)

    def _job_agent_gone(self, msg: InboundMessage) -> Failed | None:
        """A scheduled run whose agent is no longer declared does not run: as ``default`` it
        would escape its agent's limits (its tools, policy and prompt)."""
        if msg.job is None or self._settings.agent(msg.agent) is not None:
            return None
        text = (f"The scheduled job '{msg.job}' runs as agent '{msg.agent}', which is not "
                "declared any more; the run did not start.")
        log.warning("%s", text)
        return Failed(text, f"agent {msg.agent!r} is not declared")

    def _started(self, msg: InboundMessage, lease: TurnLease) -> RunRecord:
        """The run's record, and its start event, for a turn that ends before its loop."""
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.worker, record.started_at = lease.worker, record.started_at or now()
        RunEvents(self._r, msg.run_id).emit("lifecycle", phase="start",
                                            startedAt=record.started_at, resumed=False)
        return record

    def _refuse(self, msg: InboundMessage, lease: TurnLease, state: LoopState,
                blocked: BudgetStatus) -> TurnOutcome:
        """A new turn over a budget: no model call; the run ends ``error`` with the refusal
        as its reply, after the user's message in history (as any failed turn)."""
        record = self._started(msg, lease)
        b = blocked.budget
        RunEvents(self._r, msg.run_id).emit(
            "diagnostic", kind="budget", phase="refused", scope=b.scope, period=b.period,
            percent=round(blocked.share * 100, 1))
        return self._closer.finish(msg, lease, state, record,
                                   Failed(refusal_text(blocked), describe(blocked)))

    def _inputs(self, messages: list[InboundMessage], agent: AgentDefinition) -> TurnInputs:
        """What prepare needs, from Redis, the clock and the hooks (``messages[0]`` as its
        agent runs it)."""
        msg = messages[0]
        past = history.load(self._r, msg.key.as_str(), self._settings.history_limit)
        model, override = self._resolve_model(msg, agent)
        prompt = PromptOverride()
        if self._hooks.has("before_prompt_build"):
            out = self._hooks.call("before_prompt_build", {
                "run_id": msg.run_id, "messages": [m.model_dump() for m in past],
                "text": merge_texts(messages),
            })
            system, prepend = out.get("systemPrompt"), out.get("prependContext")
            prompt = PromptOverride(None if system is None else str(system),
                                    str(prepend) if prepend else None)
        facts = memory_section(self._memory) if msg.trust == "operator" else ""
        if facts:
            audit.record(self._r, "memory", "prompt_read", "ok", **audit.who(msg),
                         facts=facts.count("\n- ["), chars=len(facts))
        # One GET per turn: a fleet-wide reload reaches this worker by its next turn.
        skills = "" if self._skills is None else skills_section(
            self._skills.current().visible(msg.trust))
        return TurnInputs(messages=messages, history=past, prompt_base=self._prompt_base(agent),
                          facts=facts, now=datetime.now(UTC), model=model,
                          route_override=override, prompt=prompt, skills=skills, agent=agent)

    def _resolve_model(
        self, msg: InboundMessage, agent: AgentDefinition
    ) -> tuple[str, str | None]:
        """The turn's model, and ``provider/model`` when the agent's own provider/model or a
        ``before_model_resolve`` hook (which sees the agent's choice and has the last word)
        moved the turn off the configured primary route (the call then really goes there,
        with the configured fallbacks after it)."""
        primary = chain_from_settings(self._settings)[0]
        chosen = agent.route(primary.provider, primary.model)
        provider, model = chosen.split("/", 1) if chosen else (primary.provider, primary.model)
        if self._hooks.has("before_model_resolve"):
            out = self._hooks.call("before_model_resolve", {
                "run_id": msg.run_id, "provider": provider, "model": model, "agent": agent.name,
            })
            hooked = str(out.get("provider") or provider)
            if hooked not in ("anthropic", "openai"):
                log.warning("before_model_resolve chose unknown provider %r; keeping %s/%s",
                            hooked, provider, model)
            else:
                provider, model = hooked, str(out.get("model") or model)
        if (provider, model) == (primary.provider, primary.model):
            return model, None
        return model, f"{provider}/{model}"

    # -- resumes ---------------------------------------------------------------------------

    def resume(self, msg: InboundMessage, lease: TurnLease, attempt: int) -> TurnOutcome:
        """Continue a turn whose worker died, from its last checkpoint."""
        msg, _ = self._as_agent(msg)
        state = self._checkpoints.load(msg.run_id)
        if state is None:
            return self._closer.orphan(msg, lease, "")
        if state.final is not None and self._deliverer.sent_before_a_failover(lease, msg.run_id):
            # Its reply may be in the chat already (a failover lost what followed the send):
            # commit it, never send it twice (delivery.py).
            record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id,
                                                                conversation=msg.key)
            record.worker = lease.worker
            return self._closer.finish(msg, lease, state, record, Final(state.final),
                                       resend=False)
        log.warning("resuming turn %s (attempt %d) at iteration %d", msg.run_id, attempt, state.iteration)
        RunEvents(self._r, msg.run_id).emit(
            "lifecycle", phase="error", transient=True,
            error="the worker running this turn stopped; resuming it on another worker",
        )
        return self._drive(msg, lease, state, resumed=True)

    def resume_fanout(
        self, conv: str, run_id: str, call_id: str, result: ToolResult, worker: str,
        tool_name: str = "subagents",
    ) -> TurnOutcome:
        """The fan-out's callback: take the parked turn back, answer its call, continue.
        :class:`Fenced` when the turn was no longer parked (it was recovered after its
        deadline)."""
        taken = queue.unpark(self._r, conv, run_id, worker, self._settings.lease_seconds)
        if taken is None:
            log.warning("fan-out for %s came back after its turn was closed; dropped", run_id)
            return Fenced()
        claim, lease = taken
        msg, _ = self._as_agent(claim.messages[0])
        state = self._checkpoints.load(run_id)
        if state is None:
            return self._closer.orphan(msg, lease, claim.cancelled)
        if claim.cancelled:
            return self._closer.stopped(msg, lease, state.merged_runs)
        answer_call(state, call_id, result)
        self._checkpoints.save(state)
        RunEvents(self._r, run_id).emit("tool", phase="result", name=tool_name, callId=call_id,
                                        isError=result.is_error, result=result.content[:2000])
        return self._drive(msg, lease, state, resumed=True)

    def close_orphan(self, msg: InboundMessage, lease: TurnLease, cancelled: str) -> TurnOutcome:
        """A turn whose worker died and that will not be resumed."""
        return self._closer.orphan(msg, lease, cancelled)

    # -- run, then deliver and commit ------------------------------------------------------

    def _drive(self, msg: InboundMessage, lease: TurnLease, state: LoopState, *,
               resumed: bool) -> TurnOutcome:
        with log_context(run_id=msg.run_id, conversation=msg.key.as_str(), agent=msg.agent,
                         worker=lease.worker):
            return self._drive_turn(msg, lease, state, resumed=resumed)

    def _drive_turn(self, msg: InboundMessage, lease: TurnLease, state: LoopState, *,
                    resumed: bool) -> TurnOutcome:
        events = RunEvents(self._r, msg.run_id)
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.worker = RunStatus.running, lease.worker
        record.started_at = record.started_at or now()
        runs.put(self._r, record)
        events.emit("lifecycle", phase="start", startedAt=record.started_at, resumed=resumed)
        live = self._deliverer.live(msg)  # None unless the reply streams into a chat
        sink = EventSink(events, listener=live)
        deadline = turn_deadline(msg, record.started_at, self._settings)
        # Who acts, for the audit entries of the turn's tool calls, checks and parks.
        with audit.bound(self._r, audit.who(msg), trust=msg.trust):
            try:
                result = self._driver.run(msg, lease, state, sink, deadline)
                if live is not None:  # done streaming: the final delivery takes over
                    sink.flush()
                    live.close(parked=isinstance(result, AwaitSubagents | AwaitApproval))
            finally:
                if live is not None:
                    live.close()
            match result:
                case AwaitSubagents(call=call):
                    return self._park(msg, lease, state, call, sink)
                case AwaitApproval(call=call):
                    return self._park_for_approval(msg, lease, call, sink)
                case Cancelled():
                    return self._closer.stopped(msg, lease, state.merged_runs)
                case LeaseGone():
                    return Fenced()
                case Final() | Failed() as result:
                    sink.flush()
                    return self._closer.finish(msg, lease, state, record, result)

    def _park(self, msg: InboundMessage, lease: TurnLease, state: LoopState, call: ToolCall,
              sink: EventSink) -> TurnOutcome:
        """Checkpointed already: give the worker back and start the fan-out."""
        sink.flush()
        if not lease.park(self._fanout.deadline(call, msg.profile)):
            return Fenced()
        sink.diagnostic("subagents", phase="start", callId=call.id, worker=lease.worker)
        # The subagents get the parked turn's tools, never more (subagents/registry.py).
        self._fanout.launch(FanOutRequest(
            run_id=msg.run_id, conv=msg.key.as_str(), call=call, trust=msg.trust,
            profile=msg.profile, model=state.model,
            scope=tool_scope(msg, self._settings.turn_agent(msg.agent)), agent=msg.agent,
            user=user_of(msg),
        ))
        return Parked()

    def _park_for_approval(self, msg: InboundMessage, lease: TurnLease, call: ToolCall,
                           sink: EventSink) -> TurnOutcome:
        """Checkpointed already (the call's approval is ``pending``): give the worker back,
        then record the request and ask. A worker that dies in between leaves a parked turn
        without a request: its lease lapses after the wait and the resumed turn asks again."""
        sink.flush()
        req = self._asker.request(msg, call)
        if not lease.park(self._asker.park_seconds()):
            return Fenced()
        self._asker.ask(req)
        args_sha256, args_len = audit.arguments_digest(call.arguments)
        audit.record_here("approval", "asked", "ok", approval_id=req.approval_id, tool=call.name,
                          call_id=call.id[:64], args_sha256=args_sha256, args_len=args_len)
        sink.diagnostic("approval", phase="asked", callId=call.id, tool=call.name,
                        approvalId=req.approval_id, expiresAt=int(req.expires_at * 1000),
                        worker=lease.worker)
        return Parked()

    def resume_approval(self, approval_id: str, worker: str) -> TurnOutcome:
        """An approval was answered (or expired, or was cancelled): take the parked turn
        back, record the answer for its call, continue. :class:`Fenced` when there is nothing
        to resume (the turn moved on, was closed, or took this answer already)."""
        found = approvals.get(self._r, approval_id)
        if found is None or found.status == "pending":
            return Fenced()
        req = found.request
        state = self._checkpoints.load(req.run_id)
        if state is None or state.approvals.get(req.call_id) != "pending":
            approvals.taken(self._r, approval_id)
            return Fenced()
        taken = queue.unpark(self._r, req.conv, req.run_id, worker, self._settings.lease_seconds)
        if taken is None:
            log.warning("approval %s came back after its turn was closed; dropped", approval_id)
            approvals.taken(self._r, approval_id)
            return Fenced()
        claim, lease = taken
        msg, _ = self._as_agent(claim.messages[0])
        state = self._checkpoints.load(req.run_id) or state
        state.approvals[req.call_id] = found.mark()
        self._checkpoints.save(state)
        approvals.taken(self._r, approval_id)
        RunEvents(self._r, req.run_id).emit(
            "diagnostic", kind="approval", phase="answered", callId=req.call_id,
            approvalId=approval_id, status=found.status, decidedBy=found.decided_by or "",
        )
        if claim.cancelled:
            return self._closer.stopped(msg, lease, state.merged_runs)
        return self._drive(msg, lease, state, resumed=True)

    # -- compaction jobs -------------------------------------------------------------------

    def compact_turn(self, msg: InboundMessage, lease: TurnLease) -> TurnOutcome:
        """A compaction in the conversation's order: after a turn crossed the threshold
        (``auto``: the seed's notice when it compacted) or for /compact (a report)."""
        command = msg.compact_reason == "command"
        with LeaseKeeper(lease, self._settings.cancel_poll_seconds):
            done = self._compaction.compact(msg, None if command else POST_TURN_NOTICE,
                                            reason=msg.compact_reason or "auto")
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.started_at, record.ended_at = RunStatus.ok, record.started_at or now(), now()
        if command:
            record.reply = compaction_report(done)
        match self._deliverer.deliver(msg, lease, record, []):
            case Released(waiting=n):
                emit_end(RunEvents(self._r, msg.run_id), record)
                return Delivered(n)
            case StopWon():
                return self._closer.stopped(msg, lease, [])
            case Fenced() as fenced:
                return fenced


def compaction_report(done: Compacted | CompactionFailed | None) -> str:
    """/compact's answer."""
    if isinstance(done, Compacted):
        return f"Compacted this conversation: {done.before_tokens} → {done.after_tokens} tokens."
    if isinstance(done, CompactionFailed):
        return f"Compaction failed ({done}); the conversation is unchanged."
    return "Nothing to compact yet."
