"""SubagentSession: one subagent's bounded loop, from its first (or resumed) step to how it ended.

The loop runs under the subagent's prompt, route and tools (:func:`job_tools`), inside a
:class:`~fermix_worker.subagents.watch.SubagentWatch` (``/stop`` of the parent, the deadline, a
lost claim). Its tools see a :class:`~fermix_worker.tools.context.SubagentContext`: the trust
they act at and the parent turn's workspace, which they read and never write. A claimed run
can park for an approval (the loop stops at the call: :class:`~.park.Asking`); its
``skill_run`` runs the skill inline (:mod:`~fermix_worker.subagents.inline_skill`), a loop of
the same kind that cannot park. The outcome is a status, the answer or the error, and the
iterations used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import redis

from fermix_shared import audit
from fermix_shared.errors import ConfigError, TurnCancelled
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry, SkillSnapshot
from fermix_shared.usage.scopes import Attribution
from fermix_worker.approvals.policy import ApprovalPolicy
from fermix_worker.approvals.taint import TaintPolicy
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.interrupt import interruptible_sleep
from fermix_worker.loop import AgentLoop, AwaitApproval, AwaitSubagents, Failed, Final, LoopOutcome
from fermix_worker.loop_state import LoopState
from fermix_worker.providers import build_router
from fermix_worker.subagents.caps import SubagentCaps, caps_for
from fermix_worker.subagents.claim import SubagentClaim
from fermix_worker.subagents.inline_skill import inline_skill_run
from fermix_worker.subagents.job import SubagentJob
from fermix_worker.subagents.park import Asking, ParkedSubagent
from fermix_worker.subagents.prompts import subagent_system_prompt
from fermix_worker.subagents.registry import SubagentTools
from fermix_worker.subagents.results import Status, SubagentReport
from fermix_worker.subagents.routing import subagent_routes
from fermix_worker.subagents.semaphore import FanOutSemaphore
from fermix_worker.subagents.watch import SubagentTimedOut, SubagentWatch
from fermix_worker.tools.base import Tool, ToolResult
from fermix_worker.tools.context import RunContext, SubagentContext
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import charged_to, metered

log = logging.getLogger(__name__)

Ended = tuple[Status, str, int]


class _QuietEvents:
    """A subagent streams to nobody: it has no user."""

    def assistant_delta(self, text: str) -> None:
        pass

    def tool_start(self, call: ToolCall) -> None:
        pass

    def tool_update(self, call: ToolCall, text: str) -> None:
        pass

    def tool_result(self, call: ToolCall, result: ToolResult) -> None:
        pass

    def diagnostic(self, kind: str, **data: Any) -> None:
        pass

    def thinking(self, text: str) -> None:
        pass


class SubagentSession:
    """Runs subagents' loops on this worker; holds no per-job state."""

    def __init__(self, r: redis.Redis, settings: Settings, tools: Iterable[Tool],
                 hooks: HookRegistry, meter: UsageMeter | None,
                 skills: Callable[[], SkillRegistry] | None):
        self._r = r
        self._settings = settings
        self._tools = tools  # iterated per job (LiveTools: the MCP tools known then)
        self._hooks = hooks
        self._meter = meter
        self._skills = skills
        self._approval = ApprovalPolicy(settings.approvals)

    def run(self, job: SubagentJob, slots: FanOutSemaphore, holder: str,
            claim: SubagentClaim | None, resume: ParkedSubagent | None) -> Ended | Asking:
        """The bounded loop, from the start or from where it parked (``resume``): (status,
        answer or error, iterations), or :class:`Asking` when it stopped for an approval."""
        caps = caps_for(job.profile, job.timeout_s)
        used = resume.used_s if resume is not None else 0.0
        began = time.monotonic()
        # The per-worker timeout counts run time only (not a wait for a person's answer).
        deadline = began + min(caps.timeout_s - used, job.deadline_at - time.time())
        state = resume.state if resume is not None else self._fresh(job, caps)
        watch = SubagentWatch(self._r, job.conv, job.parent_run, deadline, slots=slots,
                              holder=holder, poll_s=self._settings.cancel_poll_seconds,
                              held=None if claim is None else claim.held)
        try:
            loop = self._agent_loop(job, caps, watch.check, deadline, can_park=claim is not None)
            with watch:
                outcome = loop.run(state)
        except TurnCancelled as e:
            return "cancelled", str(e) or "the parent turn was stopped", state.iteration
        except SubagentTimedOut:
            return "timed_out", timed_out(caps.timeout_s), state.iteration
        except ConfigError as e:
            return "failed", f"Fermix is misconfigured: {e}", state.iteration
        except Exception as e:  # a broken subagent is an entry in the result, never a crash
            log.exception("subagent %s of %s crashed", job.index, job.parent_run)
            return "failed", f"the subagent crashed: {type(e).__name__}: {e}", state.iteration
        if isinstance(outcome, AwaitApproval):
            return Asking(state, outcome.call, outcome.reason, used + time.monotonic() - began)
        return _ended(outcome, state, watch.cancelled, deadline, caps.timeout_s)

    def _agent_loop(self, job: SubagentJob, caps: SubagentCaps, check: Callable[[], None],
                    deadline: float, *, can_park: bool) -> AgentLoop:
        remaining = max(0.0, deadline - time.monotonic())
        routes = subagent_routes(self._settings, job.provider, job.model, remaining)
        router = metered(build_router(self._settings, routes), self._meter)
        provider = charged_to(router, _charged_to(job)).for_turn(
            sleep=lambda seconds: interruptible_sleep(seconds, check))
        # A skill run (fanned out or inline) gets no skill_run: a skill cannot run skills.
        inline = None if job.skill else inline_skill_run(
            job, self._settings, caps, self._snapshot, lambda: deadline - time.monotonic(),
            lambda sub, seconds: self._nested(sub, check, seconds))
        needs = self._approval.needs
        # A run that can park asks (its job waits, not the parent); one that cannot is offered
        # no tool that would wait for a person, and a tainted call is refused there.
        tools = job_tools(job, self._tools, (lambda tool: False) if can_park else needs, inline)
        return AgentLoop(
            provider, tools, _QuietEvents(), max_tokens=self._settings.max_tokens, check=check,
            hooks=self._hooks, guard=LoopGuard(GuardConfig.from_settings(self._settings)),
            needs_approval=needs if can_park else (lambda tool: False),
            taint_gate=TaintPolicy(self._settings.taint, can_ask=can_park).gate,
            # No calling turn (a subagent runs in a task of its own): its own context, and it
            # audits as its parent's subagent.
            context=RunContext(audit=recorder(self._r, job), subagent=SubagentContext(
                trust=job.trust, workspace=job.workspace)),
        )

    def _nested(self, job: SubagentJob, check: Callable[[], None], seconds: float
                ) -> SubagentReport:
        """A skill's loop inside a subagent's job (``check``: the subagent's watch), within
        ``seconds``; it cannot park."""
        caps = caps_for(job.profile, job.timeout_s)
        deadline = time.monotonic() + seconds

        def bounded() -> None:
            check()
            if time.monotonic() >= deadline:
                raise SubagentTimedOut("the skill ran out of time")

        state = self._fresh(job, caps)
        try:
            outcome = self._agent_loop(job, caps, bounded, deadline, can_park=False).run(state)
            status, text, iterations = _ended(outcome, state, "", deadline, seconds)
        except SubagentTimedOut:
            check()  # the subagent's own time is up: that ends the subagent, not the skill
            status, text, iterations = "timed_out", timed_out(seconds), state.iteration
        except ConfigError as e:
            status, text, iterations = "failed", f"Fermix is misconfigured: {e}", state.iteration
        except TurnCancelled:
            raise
        except Exception as e:
            log.exception("skill %s in subagent %s crashed", job.skill, job.index)
            status, text = "failed", f"the skill run crashed: {type(e).__name__}: {e}"
            iterations = state.iteration
        done = status == "completed"
        return SubagentReport(index=job.index, status=status, output=text if done else "",
                              error="" if done else text, iterations=iterations)

    def _snapshot(self) -> SkillSnapshot | None:
        return self._skills().current() if self._skills is not None else None

    def _fresh(self, job: SubagentJob, caps: SubagentCaps) -> LoopState:
        today = datetime.now(UTC).strftime("%A %Y-%m-%d %H:%M UTC")
        base = job.system if job.system is not None else subagent_system_prompt(job.result_format)
        state = LoopState.start(
            run_id=f"{job.parent_run}:sub{job.index}", model=job.model or job.parent_model,
            system=f"{base}\n\nCurrent date: {today}.", history=[],
            user=ChatMessage(role="user", content=job.task), context=caps.context,
        )
        state.max_iterations = min(caps.max_iterations, job.max_iterations or caps.max_iterations)
        state.reasoning_effort = job.reasoning_effort
        state.temperature = job.temperature
        return state


def _ended(outcome: LoopOutcome, state: LoopState, cancelled: str, deadline: float,
           timeout_s: float) -> Ended:
    match outcome:
        case Final(text=text) if text.strip():
            return "completed", text.strip(), state.iteration
        case Final():
            return "failed", "the subagent gave an empty answer", state.iteration
        case Failed(message=message):
            # A provider call cut short by /stop or the deadline fails like any other.
            if cancelled:
                return "cancelled", cancelled, state.iteration
            if time.monotonic() >= deadline:
                return "timed_out", timed_out(timeout_s), state.iteration
            return "failed", message, state.iteration
        case AwaitSubagents():
            return "failed", "subagents cannot be called from within a subagent", state.iteration
        case AwaitApproval(call=call):  # only a run that cannot park gets here: never asks
            return "failed", f"{call.name} needed an approval nobody could give", state.iteration
    raise AssertionError(outcome)


def job_tools(job: SubagentJob, tools: Iterable[Tool],
              needs_approval: Callable[[Tool], bool] = lambda tool: False,
              skill_run: Tool | None = None) -> SubagentTools:
    """The registry ``job``'s subagent runs with: the parent's limits it carries, narrowed by
    its own (a per-call ``tools`` list, a skill's); ``skill_run``: its inline skill_run."""
    return SubagentTools(tools, job.trust, parent_tools=job.parent_tools,
                         parent_policies=job.parent_policies, allowed_tools=job.allowed_tools,
                         policies=job.policies, needs_approval=needs_approval,
                         skill_run=skill_run)


def _charged_to(job: SubagentJob) -> Attribution:
    """The parent turn's scopes: who this subagent's (or skill run's) calls are charged to."""
    return Attribution(agent=job.parent_agent, conversation=job.conv, user=job.parent_user,
                       run_id=job.parent_run, kind="skill" if job.skill else "subagent")


def acting(job: SubagentJob) -> audit.Who:
    """A subagent acts for its parent turn: its run, conversation and agent."""
    return audit.Who(actor="subagent", run_id=job.parent_run, conv=job.conv,
                     agent=job.parent_agent)


def audit_detail(job: SubagentJob) -> dict[str, str | int | None]:
    return {"fanout_id": job.fanout_id, "subagent": job.index, "skill": job.skill or None,
            "trust": job.trust}


def recorder(r: redis.Redis, job: SubagentJob) -> audit.Recorder:
    """What the subagent's tool calls, checks and approvals are audited through."""
    return audit.recorder(r, acting(job), **audit_detail(job))


def timed_out(timeout_s: float) -> str:
    return f"the subagent did not finish within its {timeout_s:g} s time limit"
