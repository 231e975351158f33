"""SubagentRunner: one subagent, from taking a concurrency slot to its report.

A subagent is a bounded :class:`AgentLoop` (context ``subagent`` or ``ultra_subagent``) over a
fresh conversation holding only its task, under the fixed subagent prompt, with the parent's
trust and the subagent tool set: the parent turn's own tools (its agent's policy classes
and tool list within its trust, carried in the job) minus ``read_write``, ``gui_control`` and
every fan-out tool. A per-call ``tools`` list and a ``skill_run`` job (``job.skill`` set:
its own prompt, tool list, policy classes and iteration bound) only narrow that. It
writes no history, delivers nothing to any channel and touches no conversation state: its only
outputs are its report and a few diagnostic events on the parent's run (kind ``subagent``, or
``skill`` for a skill run). Every outcome, including a crash, is a report (the chord never
fails).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import redis

from fermix_shared import audit
from fermix_shared.errors import ConfigError, TurnCancelled
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import PolicyClass, RunProfile, Trust
from fermix_shared.records import VersionedRecord
from fermix_shared.run_events import SubagentEnded, SubagentStarted
from fermix_shared.settings import Settings
from fermix_shared.stores.events import RunEvents
from fermix_shared.usage.scopes import Attribution
from fermix_worker.approvals.policy import ApprovalPolicy
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.interrupt import interruptible_sleep
from fermix_worker.loop import AgentLoop, AwaitSubagents, Failed, Final
from fermix_worker.loop_state import LoopState
from fermix_worker.providers import build_router
from fermix_worker.subagents.caps import caps_for
from fermix_worker.subagents.claim import Busy, SubagentClaim, Superseded
from fermix_worker.subagents.prompts import ResultFormat, subagent_system_prompt
from fermix_worker.subagents.registry import SubagentTools
from fermix_worker.subagents.results import Status, SubagentReport
from fermix_worker.subagents.routing import subagent_routes
from fermix_worker.subagents.semaphore import FanOutSemaphore
from fermix_worker.subagents.tool import ReasoningEffort
from fermix_worker.subagents.watch import SubagentTimedOut, SubagentWatch, parent_stopped
from fermix_worker.tools.base import Tool, ToolResult
from fermix_worker.tools.context import RunContext
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import charged_to, metered

log = logging.getLogger(__name__)

# 2: the skill fields (a reader that ignored them would run a skill with wider tools).
# 3: the parent turn's tool limits (``parent_tools``, ``parent_policies``): a job without
# them would fall back to the trust's defaults, wider than its parent, so it is refused.
JOB_SCHEMA_VERSION = 3
NO_SLOT_IN_TIME = "no worker slot became free before the fan-out's deadline"
# How long a header task that found every slot of its fan-out taken waits for one, holding its
# pool slot (a parked greenlet under gevent), before re-scheduling itself through the broker.
SLOT_WAIT_S = 10.0


class SubagentJob(VersionedRecord):
    """One subagent to run: the header task's argument (it crosses to any worker)."""

    SCHEMA_VERSION = JOB_SCHEMA_VERSION

    fanout_id: str
    index: int
    task: str
    conv: str
    parent_run: str
    trust: Trust
    profile: RunProfile
    result_format: ResultFormat
    parent_model: str
    # The parent turn's tool limits, never fallen back from: its allowed-tool list (None: no
    # list, its policy classes and trust bound it) and its effective policy classes (trust ∩
    # its agent's ``policy``). The subagent gets these minus what no subagent gets.
    parent_tools: list[str] | None
    parent_policies: list[PolicyClass]
    provider: Literal["anthropic", "openai"] | None = None
    model: str | None = None
    # Accepted and carried, not yet sent: the adapters have no reasoning-effort option.
    reasoning_effort: ReasoningEffort | None = None
    concurrency: int
    timeout_s: float
    # Unix time by which every subagent of the fan-out must have reported.
    deadline_at: float
    slots_ttl_s: float
    # Set for a ``skill_run`` job: the skill's (or ``sub`` agent's) name, the system prompt
    # that replaces the fixed one (the date is appended), its tool list and policy classes
    # (None: no limit beyond the parent's), its iteration bound (within the caps') and
    # sampling temperature (None: the provider's default). A ``subagents`` job's
    # ``allowed_tools`` is the call's ``tools`` argument (None: not given).
    skill: str = ""
    system: str | None = None
    allowed_tools: list[str] | None = None
    policies: list[PolicyClass] | None = None
    max_iterations: int | None = None
    temperature: float | None = None
    # The parent turn's agent and user: the subagent's model calls are charged to the parent's
    # agent, conversation and user (children's spending counts against the parent's budgets).
    parent_agent: str = "default"
    parent_user: str = ""


@dataclass(frozen=True)
class NoSlot:
    """Every slot of the fan-out is taken: the header task re-schedules itself."""


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


class SubagentRunner:
    """Runs subagent jobs on this worker, one per header task run; holds no per-job state."""

    def __init__(self, r: redis.Redis, settings: Settings, tools: Iterable[Tool],
                 hooks: HookRegistry | None = None, *, slot_wait_s: float = SLOT_WAIT_S,
                 meter: UsageMeter | None = None):
        self._r = r
        self._meter = meter  # charges the jobs' calls to their parent (usage/metered.py)
        self._slot_wait_s = slot_wait_s
        self._settings = settings
        # Iterated per job (LiveTools: the MCP tools known then).
        self._tools = tools
        self._hooks = hooks or HookRegistry()
        self._approval = ApprovalPolicy(settings.approvals)

    def run(
        self, job: SubagentJob, worker: str, claim: SubagentClaim | None = None
    ) -> SubagentReport | NoSlot | Busy | Superseded:
        """Run the subagent if the parent still waits, a slot is free and (with ``claim``)
        no other execution ran it or runs it on a live worker."""
        why = parent_stopped(self._r, job.conv, job.parent_run)
        if why:
            self._audit_cancel(job, why)
            return SubagentReport(index=job.index, status="cancelled", error=why, worker=worker)
        if time.time() >= job.deadline_at:
            return SubagentReport(index=job.index, status="timed_out", error=NO_SLOT_IN_TIME,
                                  worker=worker)
        if claim is not None and (done := claim.reported()) is not None:
            return done
        slots = FanOutSemaphore(self._r, job.fanout_id, job.concurrency, job.slots_ttl_s)
        # One holder per subagent: a re-run takes over the slot of the execution it replaces.
        holder = str(job.index)
        if not slots.acquire(holder):
            # Wait for a slot here, taken the moment one is released (tight waves), for a
            # bounded while; then give the worker slot back and retry through the broker.
            wait_s = min(self._slot_wait_s, job.deadline_at - time.time())
            if wait_s <= 0 or not slots.wait(
                    holder, wait_s, lambda: not parent_stopped(self._r, job.conv, job.parent_run)):
                return NoSlot()
        if claim is not None:
            match claim.start():
                case Busy() as busy:  # the execution running it holds this slot: keep it
                    return busy
                case SubagentReport() as done:
                    slots.release(holder)
                    return done
        events = RunEvents(self._r, job.parent_run)
        started = time.time()
        try:
            events.emit(SubagentStarted(kind=_kind(job), name=job.skill or None, index=job.index,
                                        started_at=started, worker=worker))
            status, text, iterations = self._loop(job, slots, holder, claim)
        except BaseException:
            slots.release(holder)
            raise
        if status == "cancelled":
            self._audit_cancel(job, text)
        ended = time.time()
        report = SubagentReport(
            index=job.index, status=status, output=text if status == "completed" else "",
            error="" if status == "completed" else text, started_at=started, ended_at=ended,
            iterations=iterations, worker=worker,
        )
        if claim is not None and not claim.finish(report):
            # Taken for dead and re-run elsewhere: that run reports, and holds the slot now.
            log.warning("subagent %s of %s was re-run elsewhere; dropping this run's report",
                        job.index, job.parent_run)
            return Superseded()
        slots.release(holder)
        events.emit(SubagentEnded(kind=_kind(job), name=job.skill or None, index=job.index,
                                  status=status, started_at=started, ended_at=ended,
                                  iterations=iterations, worker=worker))
        return report

    def _audit_cancel(self, job: SubagentJob, why: str) -> None:
        audit.record(self._r, "agent", f"{'skill_run' if job.skill else 'subagent'}.cancel", "ok",
                     **_acting(job), reason=why, **_audit_detail(job))

    def _system(self, job: SubagentJob) -> str:
        today = datetime.now(UTC).strftime("%A %Y-%m-%d %H:%M UTC")
        base = job.system if job.system is not None else subagent_system_prompt(job.result_format)
        return f"{base}\n\nCurrent date: {today}."

    def _loop(
        self, job: SubagentJob, slots: FanOutSemaphore, holder: str,
        claim: SubagentClaim | None,
    ) -> tuple[Status, str, int]:
        """The bounded loop: (status, answer or error, iterations)."""
        caps = caps_for(job.profile, job.timeout_s)
        remaining = min(caps.timeout_s, job.deadline_at - time.time())
        deadline = time.monotonic() + remaining
        state = LoopState.start(
            run_id=f"{job.parent_run}:sub{job.index}", model=job.model or job.parent_model,
            system=self._system(job), history=[],
            user=ChatMessage(role="user", content=job.task), context=caps.context,
        )
        state.max_iterations = min(caps.max_iterations, job.max_iterations or caps.max_iterations)
        state.reasoning_effort = job.reasoning_effort
        state.temperature = job.temperature
        watch = SubagentWatch(self._r, job.conv, job.parent_run, deadline, slots=slots,
                              holder=holder, poll_s=self._settings.cancel_poll_seconds,
                              held=None if claim is None else claim.held)
        try:
            routes = subagent_routes(self._settings, job.provider, job.model, remaining)
            router = metered(build_router(self._settings, routes), self._meter)
            provider = charged_to(router, _charged_to(job)).for_turn(
                sleep=lambda seconds: interruptible_sleep(seconds, watch.check),
            )
            loop = AgentLoop(
                provider, job_tools(job, self._tools, self._approval.needs), _QuietEvents(),
                max_tokens=self._settings.max_tokens, check=watch.check, hooks=self._hooks,
                guard=LoopGuard(GuardConfig.from_settings(self._settings)),
                # No calling turn here (a subagent runs in a task of its own); it audits as
                # its parent's subagent.
                context=RunContext(audit=audit.recorder(self._r, _acting(job),
                                                        **_audit_detail(job))),
            )
            with watch:
                outcome = loop.run(state)
        except TurnCancelled as e:
            return "cancelled", str(e) or "the parent turn was stopped", state.iteration
        except SubagentTimedOut:
            return "timed_out", _timed_out(caps.timeout_s), state.iteration
        except ConfigError as e:
            return "failed", f"Fermix is misconfigured: {e}", state.iteration
        except Exception as e:  # a broken subagent is an entry in the result, never a crash
            log.exception("subagent %s of %s crashed", job.index, job.parent_run)
            return "failed", f"the subagent crashed: {type(e).__name__}: {e}", state.iteration
        match outcome:
            case Final(text=text) if text.strip():
                return "completed", text.strip(), state.iteration
            case Final():
                return "failed", "the subagent gave an empty answer", state.iteration
            case Failed(message=message):
                # A provider call cut short by /stop or the deadline fails like any other.
                if watch.cancelled:
                    return "cancelled", watch.cancelled, state.iteration
                if time.monotonic() >= deadline:
                    return "timed_out", _timed_out(caps.timeout_s), state.iteration
                return "failed", message, state.iteration
            case AwaitSubagents():
                return "failed", "subagents cannot be called from within a subagent", state.iteration
        raise AssertionError(outcome)


def job_tools(job: SubagentJob, tools: Iterable[Tool],
              needs_approval: Callable[[Tool], bool] = lambda tool: False) -> SubagentTools:
    """The registry ``job``'s subagent runs with: the parent's limits it carries, narrowed by
    its own (a per-call ``tools`` list, a skill's)."""
    return SubagentTools(tools, job.trust, parent_tools=job.parent_tools,
                         parent_policies=job.parent_policies, allowed_tools=job.allowed_tools,
                         policies=job.policies, needs_approval=needs_approval)


def _charged_to(job: SubagentJob) -> Attribution:
    """The parent turn's scopes: who this subagent's (or skill run's) calls are charged to."""
    return Attribution(agent=job.parent_agent, conversation=job.conv, user=job.parent_user,
                       run_id=job.parent_run, kind="skill" if job.skill else "subagent")


def _acting(job: SubagentJob) -> audit.Who:
    """A subagent acts for its parent turn: its run, conversation and agent."""
    return audit.Who(actor="subagent", run_id=job.parent_run, conv=job.conv,
                     agent=job.parent_agent)


def _audit_detail(job: SubagentJob) -> dict[str, str | int | None]:
    return {"fanout_id": job.fanout_id, "subagent": job.index, "skill": job.skill or None,
            "trust": job.trust}


def _kind(job: SubagentJob) -> Literal["subagent", "skill"]:
    """A diagnostic event's kind: ``skill`` (with its name) for a skill run."""
    return "skill" if job.skill else "subagent"


def _timed_out(timeout_s: float) -> str:
    return f"the subagent did not finish within its {timeout_s:g} s time limit"


def crash_report(raw: Any, error: BaseException, worker: str) -> SubagentReport:
    """A report for a header task that failed before or outside its subagent's loop."""
    index = raw.get("index", -1) if isinstance(raw, dict) else -1
    return SubagentReport(index=index if isinstance(index, int) else -1, status="failed",
                          error=f"the subagent could not run: {type(error).__name__}: {error}",
                          worker=worker)
