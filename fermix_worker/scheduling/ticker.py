"""The scheduler: fires due jobs once fleet-wide, and keeps each job's run outcomes.

**Tick.** Celery beat (RedBeat: one beat fleet-wide, standbys take over) sends
``fermix.schedule.tick`` every second; any worker runs it. A tick reads the jobs whose next
run is due and, for each occurrence, queues its run under an id derived from the occurrence
(``accept`` de-duplicates it) and then moves the job to its next run with a compare-and-set.
Two overlapping ticks (a failover) queue one run and move the job once.

**Missed runs.** An occurrence is fired however late the tick finds it, but only one:
occurrences missed while beat (or every worker) was down are coalesced into a single run,
and the job continues at its next regular time after now; never a burst. A run more than
``max(60 s, one interval)`` late is recorded as a ``catch_up``.

**Failures.** Each run's outcome goes to the job's history. After ``BACKOFF_AFTER``
consecutive failed runs the next run waits at least 1 min, then 2, 4, ... (doubling, capped
at 1 h); ``DISABLE_AFTER`` consecutive failures disable the job (resume re-enables it). A
successful run resets the count; a stopped run does not count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis

from fermix_shared import keys
from fermix_shared.models import InboundMessage, RunRecord, RunStatus
from fermix_shared.scheduling.firing import enqueue_run
from fermix_shared.scheduling.jobs import (
    OUTPUT_EXCERPT_CHARS,
    DeliveryStatus,
    Job,
    JobRun,
    Trigger,
    now_ms,
)
from fermix_shared.scheduling.store import JobNotFound, JobStore
from fermix_worker.turn.listeners import TurnEnded

log = logging.getLogger(__name__)

GRACE_MS = 60_000
BACKOFF_AFTER = 3
DISABLE_AFTER = 10
BACKOFF_BASE_S = 60
BACKOFF_CAP_S = 3600


@dataclass(frozen=True)
class FirePlan:
    """What a tick does with one due occurrence: fire it or not, and the record to write."""

    fire: bool
    job: Job


def grace_ms(job: Job, occurrence: int) -> int:
    """How late an occurrence may be before its run counts as a catch-up."""
    nxt = job.schedule.following(occurrence)
    return max(GRACE_MS, (nxt - occurrence) if nxt is not None else 0)


def plan_occurrence(job: Job, occurrence: int, now: int) -> FirePlan:
    """Pure: the tick's decision for ``job`` found due at ``occurrence`` (ms) at ``now``."""
    if not job.enabled or job.paused or job.next_run_at != occurrence:
        return FirePlan(False, job)  # a stale index entry: rewriting the job corrects it
    if job.expires_at is not None and occurrence >= job.expires_at:
        return FirePlan(False, job.model_copy(update={
            "enabled": False, "disabled_reason": "expired", "next_run_at": None}))
    nxt = job.next_due(occurrence, now)
    update: dict[str, object] = {"next_run_at": nxt, "last_run_at": now}
    if nxt is None:
        update.update(enabled=False, disabled_reason="done" if job.schedule.kind == "at" else "expired")
    return FirePlan(True, job.model_copy(update=update))


class Ticker:
    """Runs ticks over a Redis client; ``kick(conv)`` enqueues a run's dispatch."""

    def __init__(self, r: redis.Redis, kick: Callable[[str], None],
                 clock: Callable[[], int] = now_ms):
        self._r = r
        self._store = JobStore(r)
        self._kick = kick
        self._clock = clock

    def tick(self) -> list[str]:
        """Fire every due occurrence once; returns the jobs whose run this tick queued."""
        now = self._clock()
        fired = []
        for name, occurrence in self._store.due(now):
            try:
                if self._fire(name, occurrence, now):
                    fired.append(name)
            except Exception:  # one broken job must not stop the others
                log.exception("scheduled job %s: tick failed", name)
        return fired

    def _fire(self, name: str, occurrence: int, now: int) -> bool:
        raw = self._store.raw(name)
        if raw is None:  # removed between the index read and now: drop its index entry
            self._store.cas(name, None, None)
            return False
        job = Job.model_validate_json(raw)
        plan = plan_occurrence(job, occurrence, now)
        queued = False
        if plan.fire:
            accepted = enqueue_run(self._r, job, self._kick, scheduled_for=occurrence)
            queued = accepted.new
            if queued:
                log.info("scheduled job %s fired (occurrence %d, run %s)", name, occurrence,
                         accepted.run_id)
        # Whoever wins this compare-and-set moves the job on; the loser's accept was a duplicate.
        self._store.cas(name, raw, plan.job)
        return queued


def backoff_s(failures: int) -> int:
    """Seconds the next run waits after ``failures`` consecutive failures (0 below the bar)."""
    if failures < BACKOFF_AFTER:
        return 0
    wait: int = BACKOFF_BASE_S << (failures - BACKOFF_AFTER)
    return min(wait, BACKOFF_CAP_S)


def after_run(job: Job, status: RunStatus, ended: int) -> Job:
    """Pure: the job after a run ended with ``status`` (failure count, backoff, disable)."""
    failures = job.consecutive_failures
    if status is RunStatus.ok:
        failures = 0
    elif status is RunStatus.error:
        failures += 1
    update: dict[str, object] = {"consecutive_failures": failures}
    if failures >= DISABLE_AFTER:
        update.update(enabled=False, next_run_at=None,
                      disabled_reason=f"{failures} consecutive failures")
    elif (wait := backoff_s(failures)) and job.next_run_at is not None:
        ready = ended + wait * 1000
        if job.next_run_at < ready:
            update["next_run_at"] = job.next_due(job.next_run_at, ready - 1)
            if update["next_run_at"] is None:
                update.update(enabled=False, disabled_reason="expired")
    return job.model_copy(update=update)


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def job_run(msg: InboundMessage, record: RunRecord, job: Job, usage: tuple[int, int]) -> JobRun:
    """The history entry of a finished run."""
    status = record.status.value if record.status.terminal else "error"
    trigger: Trigger = "manual"
    if msg.scheduled_for is not None:
        late = int(msg.accepted_at * 1000) - msg.scheduled_for
        trigger = "catch_up" if late > grace_ms(job, msg.scheduled_for) else "schedule"
    delivery: DeliveryStatus = record.delivery or "none"
    if record.delivery is None and record.status is RunStatus.ok and not record.reply:
        delivery = "silent"
    output = record.reply if record.status is RunStatus.ok else record.error
    return JobRun(
        run_id=record.run_id, status=status, trigger=trigger,  # type: ignore[arg-type]
        scheduled_for=msg.scheduled_for, started_at=_ms(record.started_at),
        ended_at=_ms(record.ended_at) or now_ms(), output=(output or "")[:OUTPUT_EXCERPT_CHARS],
        input_tokens=usage[0], output_tokens=usage[1], delivery=delivery,
    )


class RecordJobRun:
    """Post-turn listener: a scheduled run ended — its history entry, the job's failure count,
    and an expiry on the run's own conversation history (the run record and events keep the
    run for a week)."""

    def __init__(self, r: redis.Redis):
        self._r = r

    def __call__(self, ended: TurnEnded) -> None:
        if ended.msg.job is not None:
            record_run(self._r, ended.msg, ended.record, ended.usage)


def record_run(r: redis.Redis, msg: InboundMessage, record: RunRecord,
               usage: tuple[int, int]) -> None:
    """Record the ended run ``record`` of the job ``msg.job``."""
    if msg.job is None:
        return
    store = JobStore(r)
    try:
        current = store.require(msg.job)
        entry = job_run(msg, record, current, usage)
        ended = entry.ended_at
        job = store.update(msg.job, lambda j: after_run(j, record.status, ended), run=entry)
        if not job.enabled and current.enabled:
            log.warning("scheduled job %s disabled: %s", job.name, job.disabled_reason)
    except JobNotFound:
        log.info("scheduled job %s was removed before its run %s ended", msg.job, msg.run_id)
    except Exception:  # the run itself is done and delivered; history is best effort
        log.exception("could not record run %s of scheduled job %s", msg.run_id, msg.job)
    r.expire(keys.history(msg.key.as_str()), keys.SCHED_RUN_HISTORY_TTL_SECONDS)
