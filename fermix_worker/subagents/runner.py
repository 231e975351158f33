"""SubagentRunner: one subagent, from taking a concurrency slot to its report.

A subagent is a bounded :class:`AgentLoop` (context ``subagent`` or ``ultra_subagent``) over a
fresh conversation holding only its task, under the fixed subagent prompt, with the parent's
trust and the subagent tool set: the parent turn's own tools (its agent's policy classes
and tool list within its trust, carried in the job) minus ``read_write``, ``gui_control`` and
every fan-out tool. A per-call ``tools`` list and a ``skill_run`` job (``job.skill`` set:
its own prompt, tool list, policy classes and iteration bound) only narrow that. It
writes no history, delivers nothing to any channel and touches no conversation state: its only
outputs are its report and a few diagnostic events on the parent's run (kind ``subagent``, or
``skill`` for a skill run). It reads the parent turn's workspace (file tools, and commands in a
bubblewrap of their own with the workspace read-only) and runs skills inline
(:mod:`~fermix_worker.subagents.session`). A call that needs a person's approval parks the
subagent's job, never the parent (:mod:`~fermix_worker.subagents.park`). Every outcome,
including a crash, is a report (the chord never fails).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import redis

from fermix_shared import audit
from fermix_shared.channels.base import OutboundChannel
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import Channel
from fermix_shared.run_events import SubagentEnded, SubagentStarted
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry
from fermix_shared.stores.events import RunEvents
from fermix_worker.subagents.claim import Busy, SubagentClaim, Superseded
from fermix_worker.subagents.job import JOB_SCHEMA_VERSION as JOB_SCHEMA_VERSION
from fermix_worker.subagents.job import SubagentJob as SubagentJob
from fermix_worker.subagents.park import (
    PARK_POLL_S,
    SLOT_POLL_S,
    WAITED_PAST_DEADLINE,
    Asking,
    Parked,
    ParkedSubagent,
    SubagentParking,
)
from fermix_worker.subagents.results import Status, SubagentReport
from fermix_worker.subagents.semaphore import FanOutSemaphore
from fermix_worker.subagents.session import SubagentSession, acting, audit_detail, recorder
from fermix_worker.subagents.session import job_tools as job_tools
from fermix_worker.subagents.watch import parent_stopped
from fermix_worker.tools.base import Tool
from fermix_worker.usage.meter import UsageMeter

log = logging.getLogger(__name__)

NO_SLOT_IN_TIME = "no worker slot became free before the fan-out's deadline"
# How long a header task that found every slot of its fan-out taken waits for one, holding its
# pool slot (a parked greenlet under gevent), before re-scheduling itself through the broker.
SLOT_WAIT_S = 10.0


@dataclass(frozen=True)
class NoSlot:
    """Every slot of the fan-out is taken: the header task re-schedules itself."""


RunOutcome = SubagentReport | NoSlot | Busy | Superseded | Parked


class SubagentRunner:
    """Runs subagent jobs on this worker, one per header task run; holds no per-job state.
    ``skills``: the process's skill registry (a subagent's ``skill_run`` resolves names in
    it); ``channels``: where the subagents' approvals are asked."""

    def __init__(self, r: redis.Redis, settings: Settings, tools: Iterable[Tool],
                 hooks: HookRegistry | None = None, *, slot_wait_s: float = SLOT_WAIT_S,
                 meter: UsageMeter | None = None,
                 skills: Callable[[], SkillRegistry] | None = None,
                 channels: Callable[[Channel], OutboundChannel | None] | None = None):
        self._r = r
        self._slot_wait_s = slot_wait_s
        # The jobs' calls are charged to their parent (usage/metered.py) through ``meter``.
        self._session = SubagentSession(r, settings, tools, hooks or HookRegistry(), meter,
                                        skills)
        self._parking = SubagentParking(r, settings, channels)

    def run(self, job: SubagentJob, worker: str, claim: SubagentClaim | None = None
            ) -> RunOutcome:
        """Run the subagent if the parent still waits, a slot is free and (with ``claim``)
        no other execution ran it or runs it on a live worker. A park's retry
        (``claim.park_token``) takes its parked subagent back and goes on once answered."""
        if claim is not None and claim.park_token is not None:
            return self._parked_retry(job, worker, claim)
        why = parent_stopped(self._r, job.conv, job.parent_run)
        if why:
            self._audit_cancel(job, why)
            return SubagentReport(index=job.index, status="cancelled", error=why, worker=worker)
        if time.time() >= job.deadline_at:
            return SubagentReport(index=job.index, status="timed_out", error=NO_SLOT_IN_TIME,
                                  worker=worker)
        if claim is not None and (done := claim.reported()) is not None:
            return done
        slots = self._slots(job)
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
            if claim.parked is not None:  # parked by a worker that died: go on with it
                parked = ParkedSubagent.model_validate_json(claim.parked)
                return self._go_on(job, worker, claim, parked, slots)
        return self._held(job, worker, claim, slots, None)

    def _slots(self, job: SubagentJob) -> FanOutSemaphore:
        return FanOutSemaphore(self._r, job.fanout_id, job.concurrency, job.slots_ttl_s)

    def _parked_retry(self, job: SubagentJob, worker: str, claim: SubagentClaim) -> RunOutcome:
        """A park's own retry: take the parked subagent back (no slot yet)."""
        match claim.start():
            case Busy() as busy:  # a re-run took it over, on a live worker
                return busy
            case SubagentReport() as done:
                return done
        if claim.parked is None:  # its park keeps its state; fail closed all the same
            return self._finish(job, claim, None, SubagentReport(
                index=job.index, status="failed", worker=worker,
                error="the subagent's state was lost while it waited for an approval"))
        return self._go_on(job, worker, claim,
                           ParkedSubagent.model_validate_json(claim.parked), None)

    def _go_on(self, job: SubagentJob, worker: str, claim: SubagentClaim,
               parked: ParkedSubagent, slots: FanOutSemaphore | None) -> RunOutcome:
        """This execution holds a parked subagent (and its slot, unless ``slots`` is None):
        end it when its parent stopped or its deadline passed, park it again until its answer
        (then a slot) has come, else go on from where it parked with the answer."""
        holder, sem = str(job.index), slots or self._slots(job)
        stopped = parent_stopped(self._r, job.conv, job.parent_run)
        if stopped or time.time() >= job.deadline_at:
            status: Status = "cancelled" if stopped else "timed_out"
            why = stopped or WAITED_PAST_DEADLINE
            self._parking.withdraw(job, parked, "cancelled" if stopped else "expired", why)
            if stopped:
                self._audit_cancel(job, why)
            return self._finish(job, claim, slots, SubagentReport(
                index=job.index, status=status, error=why, started_at=parked.started_at,
                ended_at=time.time(), iterations=parked.state.iteration, worker=worker))
        mark = self._parking.answer(parked)
        if mark is None or (slots is None and not sem.acquire(holder)):
            token = claim.park(parked.model_dump_json())
            if token is None:  # a re-run took it over (and holds the slot now)
                return Superseded()
            if slots is not None:
                slots.release(holder)
            return Parked(token, PARK_POLL_S if mark is None else SLOT_POLL_S)
        self._parking.took(job, parked)
        parked.state.approvals[parked.call_id] = mark
        return self._held(job, worker, claim, sem, parked)

    def _held(self, job: SubagentJob, worker: str, claim: SubagentClaim | None,
              slots: FanOutSemaphore, resume: ParkedSubagent | None) -> RunOutcome:
        """Run the subagent whose slot (and claim) this execution holds, from the start or
        from where it parked (``resume``)."""
        holder = str(job.index)
        started = resume.started_at if resume is not None else time.time()
        try:
            if resume is None:
                RunEvents(self._r, job.parent_run).emit(SubagentStarted(
                    kind=_kind(job), name=job.skill or None, index=job.index,
                    started_at=started, worker=worker))
            result = self._session.run(job, slots, holder, claim, resume)
        except BaseException:
            slots.release(holder)
            raise
        if isinstance(result, Asking):
            assert claim is not None  # only a claimed run can park
            out = self._parking.park(job, claim, result, started, worker,
                                     recorder(self._r, job))
            if isinstance(out, Parked):  # (a re-run that took it over holds the slot now)
                slots.release(holder)
            return out
        status, text, iterations = result
        if status == "cancelled":
            self._audit_cancel(job, text)
        return self._finish(job, claim, slots, SubagentReport(
            index=job.index, status=status, output=text if status == "completed" else "",
            error="" if status == "completed" else text, started_at=started,
            ended_at=time.time(), iterations=iterations, worker=worker,
        ))

    def _finish(self, job: SubagentJob, claim: SubagentClaim | None,
                slots: FanOutSemaphore | None, report: SubagentReport) -> RunOutcome:
        """Record ``report`` (with ``claim``), give the slot back (if held) and say so."""
        if claim is not None and not claim.finish(report):
            # Taken for dead and re-run elsewhere: that run reports, and holds the slot now.
            log.warning("subagent %s of %s was re-run elsewhere; dropping this run's report",
                        job.index, job.parent_run)
            return Superseded()
        if slots is not None:
            slots.release(str(job.index))
        RunEvents(self._r, job.parent_run).emit(SubagentEnded(
            kind=_kind(job), name=job.skill or None, index=job.index, status=report.status,
            started_at=report.started_at or time.time(), ended_at=report.ended_at or time.time(),
            iterations=report.iterations, worker=report.worker))
        return report

    def _audit_cancel(self, job: SubagentJob, why: str) -> None:
        audit.record(self._r, "agent", f"{'skill_run' if job.skill else 'subagent'}.cancel", "ok",
                     **acting(job), reason=why, **audit_detail(job))


def _kind(job: SubagentJob) -> Literal["subagent", "skill"]:
    """A diagnostic event's kind: ``skill`` (with its name) for a skill run."""
    return "skill" if job.skill else "subagent"


def crash_report(raw: Any, error: BaseException, worker: str) -> SubagentReport:
    """A report for a header task that failed before or outside its subagent's loop."""
    index = raw.get("index", -1) if isinstance(raw, dict) else -1
    return SubagentReport(index=index if isinstance(index, int) else -1, status="failed",
                          error=f"the subagent could not run: {type(error).__name__}: {error}",
                          worker=worker)
