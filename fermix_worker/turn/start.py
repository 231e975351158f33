"""Starting a turn: a claimed new message becomes a checkpointed state, then runs.

:meth:`TurnStarter.run` is the way in for a message the dispatcher claimed: a killed agent's
message is refused at once (its reply says so; nothing is prepared or committed), then budgets
(a refused turn calls no model), a preflight compaction when the conversation is near its limit,
then :func:`~fermix_worker.turn.prepare.prepare` over what this module gathers (history, the
prompt base and memory files, remembered facts, skills, the hooks' say on model and prompt).
The state is checkpointed and the user's message appended to history before the loop runs,
so a worker that dies from there on leaves a resumable turn
(:mod:`~fermix_worker.turn.resume`). :meth:`TurnStarter.compact` runs a compaction job in the
conversation's order.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from fermix_shared import audit, tracing
from fermix_shared.agents import lifecycle
from fermix_shared.agents.definitions import AgentDefinition, agent_named
from fermix_shared.agents.lifecycle import KILLED_REPLY
from fermix_shared.memory import MemoryStore, memory_section
from fermix_shared.memory.prompt_files import memory_files_section, prompt_memory_files
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.run_events import BudgetRefused, RunStarted
from fermix_shared.skills import skills_section
from fermix_shared.stores import history, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Fenced, Released, StopWon
from fermix_shared.usage.budgets import BudgetStatus, describe, refusal_text
from fermix_worker.compaction import POST_TURN_NOTICE, PREFLIGHT_NOTICE
from fermix_worker.compaction.conversation import Compacted, CompactionFailed
from fermix_worker.loop import Failed
from fermix_worker.loop_state import LoopState
from fermix_worker.memory.recall import MemoryRecall
from fermix_worker.providers.routes import chain_from_settings
from fermix_worker.turn.events import emit_end
from fermix_worker.turn.lease import LeaseKeeper
from fermix_worker.turn.outcome import Delivered, TurnOutcome
from fermix_worker.turn.prepare import (
    PromptOverride,
    TurnInputs,
    merge_texts,
    prepare,
    prompt_base,
)
from fermix_worker.turn.proceed import Proceed
from fermix_worker.turn.reads import TurnReads, read
from fermix_worker.turn.start_hooks import (
    before_agent_start,
    bootstrap_files,
    hooked_route,
    start_session,
)
from fermix_worker.turn.wiring import TurnParts
from fermix_worker.usage.budgets import BudgetGate

log = logging.getLogger(__name__)


class TurnStarter:
    """Starts claimed new messages (and compaction jobs) as turns (module docstring)."""

    def __init__(self, parts: TurnParts, proceed: Proceed):
        wiring = parts.wiring
        self._parts, self._proceed = parts, proceed
        self._wiring, self._r, self._settings = wiring, wiring.redis, wiring.settings
        self._memory = MemoryStore(wiring.redis)
        self._recall = MemoryRecall(self._memory, wiring.redis, wiring.settings)
        self._budgets = BudgetGate(wiring.redis, wiring.settings)
        # Memory files are read once per process (restart workers after editing them).
        self._memory_files = prompt_memory_files(wiring.settings.home)

    def run(self, messages: list[InboundMessage], lease: TurnLease) -> TurnOutcome:
        """Run the claimed turn (messages[0], plus any merged into it)."""
        parts = self._parts
        # The steps are spans of the turn's when tracing is on (benchmarks/waterfall.py).
        with tracing.span("fermix.admit"):
            msg, agent = self._wiring.as_agent(messages[0])
            reads = read(self._r, msg, history_limit=self._settings.history_limit,
                         budgets=self._settings.usage.enabled, memory=msg.trust == "operator",
                         skills=self._wiring.skills is not None)
            if (refusal := self._killed(messages[0], reads)) is not None:
                reads.give_back(self._r)
                return parts.closer.refused(messages[0], lease,
                                            self._started(messages[0], lease), refusal,
                                            [m.run_id for m in messages[1:]])
            messages = [msg, *messages[1:]]
            # Budgets first: a refused turn calls no model, not even for preflight compaction.
            over_budget = self._budgets.blocking(msg, reads.budgets)
            agent_gone = self._job_agent_gone(msg)
            compacted = False
            if over_budget is None and agent_gone is None and parts.compaction.needed_by(
                    reads.measurement, reads.backing_off):
                with LeaseKeeper(lease, self._settings.cancel_poll_seconds):
                    parts.compaction.compact(msg, PREFLIGHT_NOTICE, reason="preflight")
                compacted = True  # the history read before it is not the history now
            start_session(self._wiring.hooks, msg, reads.session_id)
        with tracing.span("fermix.prepare"):
            inputs, (system_prompt, memory_files) = self._inputs(messages, agent, reads,
                                                                 compacted)
            state = prepare(inputs)
        # One round trip, in this order: the checkpoint first (from here on, a worker that dies
        # leaves a resumable turn), the record's start, the user's message in history.
        with tracing.span("fermix.first_writes"), self._r.pipeline(transaction=False) as pipe:
            parts.checkpoints.save(state, pipe)
            parts.recorder.start(inputs, system_prompt, memory_files, pipe)
            history.append(pipe, reads.conv, [state.messages[-1]])
            wrote = pipe.execute(raise_on_error=False)
        checkpointed, appended = wrote[0], wrote[-1]
        for result in (checkpointed, appended):  # the turn's own state: a failure fails it
            if isinstance(result, Exception):
                raise result
        if parts.recorder.enabled and isinstance(wrote[1], Exception):  # the record only
            log.warning("the recorder could not write run %s's start: %s", msg.run_id, wrote[1])
        if over_budget is not None:
            return self._refuse(msg, lease, state, over_budget)
        if agent_gone is not None:
            return parts.closer.finish(msg, lease, state, self._started(msg, lease), agent_gone)
        # The record as read (since the claim, before a preflight compaction's seconds).
        return self._proceed(msg, lease, state, resumed=False,
                             read=None if compacted else reads.record)

    def _killed(self, msg: InboundMessage, reads: TurnReads) -> str | None:
        """The reply of a message whose agent was killed (read after the claim, so a kill
        either finds this turn running, and stops it, or is seen here), audited as a failed
        check; None when the agent may take it."""
        definition = agent_named(self._settings.agents, msg.agent)
        if lifecycle.kill_from(reads.kill, definition) is None:
            return None
        audit.record(self._r, "check", "agent.killed", "fail", **audit.who(msg), check="killed")
        return KILLED_REPLY.format(agent=msg.agent)

    def _job_agent_gone(self, msg: InboundMessage) -> Failed | None:
        """A scheduled run whose agent is no longer declared does not run: as ``default`` it
        would escape its agent's limits (its tools, policy and prompt)."""
        if msg.job is None or agent_named(self._settings.agents, msg.agent) is not None:
            return None
        text = (f"The scheduled job '{msg.job}' runs as agent '{msg.agent}', which is not "
                "declared any more; the run did not start.")
        log.warning("%s", text)
        return Failed(text, f"agent {msg.agent!r} is not declared")

    def _started(self, msg: InboundMessage, lease: TurnLease) -> RunRecord:
        """The run's record, and its start event, for a turn that ends before its loop."""
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.worker, record.started_at = lease.worker, record.started_at or now()
        RunEvents(self._r, msg.run_id).emit(RunStarted(started_at=record.started_at,
                                                       resumed=False))
        return record

    def _refuse(self, msg: InboundMessage, lease: TurnLease, state: LoopState,
                blocked: BudgetStatus) -> TurnOutcome:
        """A new turn over a budget: no model call; the run ends ``error`` with the refusal
        as its reply, and history gets the failed marker after the user's message (as any
        failed turn: the refusal text is not committed)."""
        record = self._started(msg, lease)
        b = blocked.budget
        RunEvents(self._r, msg.run_id).emit(BudgetRefused(
            scope=b.scope, period=b.period, percent=round(blocked.share * 100, 1)))
        return self._parts.closer.finish(msg, lease, state, record,
                                         Failed(refusal_text(blocked), describe(blocked)))

    # -- what prepare needs ----------------------------------------------------------------

    def _prompt_parts(self, msg: InboundMessage, agent: AgentDefinition) -> tuple[str, str]:
        """The agent's system prompt (the configured one unless it has its own), and the
        memory files' section (the bootstrap files, after the ``agent:bootstrap`` hooks)."""
        system = agent.system_prompt or self._settings.system_prompt
        files = bootstrap_files(self._wiring.hooks, msg, agent, self._memory_files)
        return system, memory_files_section(files)

    def _inputs(self, messages: list[InboundMessage], agent: AgentDefinition, reads: TurnReads,
                compacted: bool) -> tuple[TurnInputs, tuple[str, str]]:
        """What prepare needs, from the turn's reads (history again after a preflight
        compaction), the clock and the hooks (``messages[0]`` as its agent runs it), and the
        prompt's parts (for the turn's record)."""
        msg, hooks, skills_registry = messages[0], self._wiring.hooks, self._wiring.skills
        past = (history.load(self._r, msg.key.as_str(), self._settings.history_limit)
                if compacted else reads.history)
        legacy = before_agent_start(hooks, msg, agent, past, merge_texts(messages))
        model, override = self._resolve_model(msg, agent, legacy)
        system, prepend = legacy.get("systemPrompt"), legacy.get("prependContext")
        if hooks.has("before_prompt_build"):
            out = hooks.call("before_prompt_build", {
                "run_id": msg.run_id, "messages": [m.model_dump() for m in past],
                "text": merge_texts(messages),
            })
            system, prepend = out.get("systemPrompt", system), out.get("prependContext", prepend)
        prompt = PromptOverride(None if system is None else str(system),
                                str(prepend) if prepend else None)
        facts = ""
        if msg.trust == "operator":  # the facts most relevant to the message (memory/recall.py)
            recalled = self._recall.relevant(merge_texts(messages), reads.active_facts)
            facts = memory_section(recalled.facts)
            if facts:
                audit.record(self._r, "memory", "prompt_read", "ok", **audit.who(msg),
                             facts=facts.count("\n- ["), chars=len(facts),
                             ranking=recalled.ranking)
        # The version is read with every turn: a fleet-wide reload reaches this worker by its
        # next turn.
        skills = "" if skills_registry is None else skills_section(
            skills_registry.current(reads.skills_version).visible(msg.trust))
        prompt_parts = self._prompt_parts(msg, agent)
        return TurnInputs(messages=messages, history=past, prompt_base=prompt_base(*prompt_parts),
                          facts=facts, now=datetime.now(UTC), model=model,
                          route_override=override, prompt=prompt, skills=skills,
                          agent=agent), prompt_parts

    def _resolve_model(
        self, msg: InboundMessage, agent: AgentDefinition, legacy: dict[str, object]
    ) -> tuple[str, str | None]:
        """The turn's model, and ``provider/model`` when the agent's own provider/model, a
        ``before_agent_start`` hook (``legacy``) or a ``before_model_resolve`` hook (which sees
        the choice so far and has the last word) moved the turn off the configured primary
        route (the call then really goes there, with the configured fallbacks after it)."""
        hooks = self._wiring.hooks
        primary = chain_from_settings(self._settings)[0]
        chosen = agent.route(primary.provider, primary.model)
        provider, model = chosen.split("/", 1) if chosen else (primary.provider, primary.model)
        provider, model = hooked_route("before_agent_start", legacy, provider, model)
        if hooks.has("before_model_resolve"):
            out = hooks.call("before_model_resolve", {
                "run_id": msg.run_id, "provider": provider, "model": model, "agent": agent.name,
            })
            provider, model = hooked_route("before_model_resolve", out, provider, model)
        if (provider, model) == (primary.provider, primary.model):
            return model, None
        return model, f"{provider}/{model}"

    # -- compaction jobs -------------------------------------------------------------------

    def compact(self, msg: InboundMessage, lease: TurnLease) -> TurnOutcome:
        """A compaction in the conversation's order: after a turn crossed the threshold
        (``auto``: the seed's notice when it compacted) or for /compact (a report)."""
        parts = self._parts
        command = msg.compact_reason == "command"
        with LeaseKeeper(lease, self._settings.cancel_poll_seconds):
            done = parts.compaction.compact(msg, None if command else POST_TURN_NOTICE,
                                            reason=msg.compact_reason or "auto")
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.started_at, record.ended_at = RunStatus.ok, record.started_at or now(), now()
        if command:
            record.reply = compaction_report(done)
        match parts.deliverer.deliver(msg, lease, record, []):
            case Released(waiting=n):
                emit_end(RunEvents(self._r, msg.run_id), record)
                return Delivered(n)
            case StopWon():
                return parts.closer.stopped(msg, lease, [])
            case Fenced() as fenced:
                return fenced


def compaction_report(done: Compacted | CompactionFailed | None) -> str:
    """/compact's answer: the provider-measured size before, or "~" and an estimate when the
    conversation had no measurement; the size after is an estimate ("~")."""
    if isinstance(done, Compacted):
        before = f"~{done.before_tokens}" if done.before_estimated else str(done.before_tokens)
        return f"Compacted this conversation: {before} → ~{done.after_tokens} tokens."
    if isinstance(done, CompactionFailed):
        return f"Compaction failed ({done}); the conversation is unchanged."
    return "Nothing to compact yet."
