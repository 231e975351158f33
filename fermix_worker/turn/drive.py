"""Run: the agent loop over a turn's state, with overflow recovery, under the turn's lease.

:meth:`TurnDriver.run` never raises for the turn's own reasons: what the loop returned, or why
it stopped, comes back as one of a closed set (:data:`RunResult`). The lease keeper renews the
lease, and a /stop, a lost lease or the turn's deadline interrupt the loop where it blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from fermix_shared.agents.definitions import AgentDefinition, turn_agent
from fermix_shared.errors import ConfigError, LeaseLost, TurnCancelled, TurnTimedOut
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores.lease import TurnLease
from fermix_shared.usage.scopes import attribution_for
from fermix_worker.approvals.policy import ApprovalPolicy, ask_in
from fermix_worker.approvals.taint import TaintPolicy
from fermix_worker.compaction import OVERFLOW_MESSAGE
from fermix_worker.compaction.step import CompactionStep
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.interrupt import interruptible_sleep
from fermix_worker.loop import (
    AgentLoop,
    AwaitApproval,
    AwaitSubagents,
    CompletingProvider,
    Failed,
    Final,
    LoopOutcome,
    LoopTools,
)
from fermix_worker.loop_state import LoopState
from fermix_worker.providers import Router, override_route
from fermix_worker.recorder.recording import Recorder
from fermix_worker.subagents.tool import for_profile
from fermix_worker.tools import ToolScope
from fermix_worker.tools.base import ToolRegistry
from fermix_worker.tools.context import AuditRecorder, RunContext
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.events import EventSink
from fermix_worker.turn.lease import HandedOff, LeaseKeeper, TurnDeadline
from fermix_worker.usage.metered import charged_to

log = logging.getLogger(__name__)

GENERIC_ERROR = "Sorry — something went wrong while handling that. Please try again."
# Overflow recoveries (compact, then retry the loop) one turn may make.
OVERFLOW_RETRIES = 2


@dataclass(frozen=True)
class Cancelled:
    """/stop reached the turn while it ran."""


@dataclass(frozen=True)
class LeaseGone:
    """The turn lost its lease (another worker took the conversation over)."""


RunResult = Final | Failed | AwaitSubagents | AwaitApproval | Cancelled | LeaseGone


def tool_scope(msg: InboundMessage, agent: AgentDefinition | None = None) -> ToolScope:
    """The caller's trust, narrowed to its tool subset (a scheduled job's, and the agent's:
    see :func:`~fermix_shared.agents.definitions.as_agent`) and to the agent's policy classes."""
    subset = None if msg.allowed_tools is None else tuple(msg.allowed_tools)
    policies = None if agent is None or agent.policy is None else frozenset(agent.policy)
    return ToolScope(msg.trust, allowed_tools=subset, policies=policies,
                     has_chat=ask_in(msg) is not None)


class TurnDriver:
    def __init__(
        self,
        settings: Settings,
        tools: ToolRegistry,
        router: Callable[[], Router],
        hooks: HookRegistry,
        checkpoints: Checkpoints,
        compaction: CompactionStep,
        working: Callable[[InboundMessage], AbstractContextManager[None]],
        recorder: Recorder | None = None,
    ):
        self._settings = settings
        self._tools = tools
        self._router = router
        self._hooks = hooks
        self._checkpoints = checkpoints
        self._compaction = compaction
        self._working = working
        self._recorder = recorder
        self._approval = ApprovalPolicy(settings.approvals)
        self._taint = TaintPolicy(settings.taint)

    def run(
        self, msg: InboundMessage, lease: TurnLease, state: LoopState, sink: EventSink,
        deadline: TurnDeadline, acting: AuditRecorder,
    ) -> RunResult:
        """Run the loop to its end (or to a park), checkpointing every step; the turn's tools
        audit through ``acting``."""
        s = self._settings
        try:
            with LeaseKeeper(lease, s.cancel_poll_seconds, deadline) as keeper, \
                    self._working(msg):
                # Under the lease: listing MCP tools may wait for a server.
                # Under /ultra the subagents tool advertises the wider caps.
                tools = for_profile(self._tools.scoped(
                    tool_scope(msg, turn_agent(s.agents, msg.agent))), msg.profile)
                # Tools acting for the turn see what it is offered (a job it schedules
                # gets no more).
                context = RunContext.for_turn(msg, lambda name: tools.get(name) is not None,
                                              audit=acting)
                loop = self._loop(msg, lease, state, sink, keeper, tools, context)
                outcome = self._recovering(msg, state, loop)
                # A call cut short by /stop or the deadline ends as such, not as its error.
                keeper.check()
                self._agent_end(msg, state, outcome)
                return outcome
        except HandedOff:
            log.info("turn %s handed over (worker shutting down); resumes elsewhere", msg.run_id)
            return LeaseGone()
        except LeaseLost:
            log.warning("turn %s lost its lease; fenced, not delivering", msg.run_id)
            return LeaseGone()
        except TurnCancelled:
            return Cancelled()
        except TurnTimedOut as e:
            log.warning("turn %s passed its deadline (%g s); stopped", msg.run_id, e.timeout_s)
            return Failed(str(e), str(e))
        except ConfigError as e:
            return Failed(f"Fermix is misconfigured: {e}", str(e))
        except Exception as e:
            log.exception("turn %s crashed", msg.run_id)
            return Failed(GENERIC_ERROR, f"{type(e).__name__}: {e}")

    def _loop(
        self, msg: InboundMessage, lease: TurnLease, state: LoopState, sink: EventSink,
        keeper: LeaseKeeper, tools: ToolRegistry, context: RunContext,
    ) -> AgentLoop:
        s, recorder = self._settings, self._recorder
        merged = state.merged_runs

        def steered() -> list[str]:
            taken = lease.take_steered()
            merged.extend(m.run_id for m in taken)
            texts = [m.text for m in taken]
            if recorder is not None:
                recorder.steered(state, texts)
            return texts

        # The turn's model calls are charged to its agent, conversation and user.
        router = charged_to(self._router(), attribution_for(msg))
        if state.route_override:
            router = router.with_primary(override_route(s, state.route_override))
        provider = router.for_turn(
            on_event=sink.routing, pinned=state.route,
            sleep=lambda seconds: interruptible_sleep(seconds, keeper.check),
        )
        calls: CompletingProvider = provider
        offered: LoopTools = tools
        if recorder is not None:  # what the turn sends and gets, for replay and fork
            calls, offered = recorder.provider(provider, state), recorder.tools(tools, state.run_id)
        return AgentLoop(
            calls, offered, sink,
            max_tokens=s.max_tokens, check=keeper.check, inject=steered,
            checkpoint=self._checkpoints.save, hooks=self._hooks,
            blocking=keeper.interruptible, guard=LoopGuard(GuardConfig.from_settings(s)),
            needs_approval=self._approval.needs, taint_gate=self._taint.gate, context=context,
        )

    def _recovering(
        self, msg: InboundMessage, state: LoopState, loop: AgentLoop
    ) -> LoopOutcome:
        """The loop; on a context overflow, shrink the prompt and run it again (bounded)."""
        outcome = loop.run(state)
        for _ in range(OVERFLOW_RETRIES):
            if not (isinstance(outcome, Failed) and outcome.overflow):
                break
            self._compaction.recovering(msg)
            shrunk = self._compaction.shrink(msg, state)
            self._checkpoints.save(state)
            if not shrunk:
                break
            outcome = loop.run(state)
        if isinstance(outcome, Failed) and outcome.overflow:
            return Failed(OVERFLOW_MESSAGE, outcome.detail)
        return outcome

    def _agent_end(
        self, msg: InboundMessage, state: LoopState, outcome: LoopOutcome
    ) -> None:
        if self._hooks.has("agent_end"):
            self._hooks.call("agent_end", {
                "run_id": msg.run_id, "messages": [m.model_dump() for m in state.turn_messages()],
                "ok": isinstance(outcome, Final), "iterations": state.iteration,
            })
