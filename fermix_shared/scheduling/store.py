"""JobStore: scheduled jobs in Redis, shared by the CLI, the agent tools and the scheduler.

Layout (``fermix_shared/keys.py``): a hash of job records, a sorted set name -> next run (ms)
holding exactly the jobs that can fire, and a capped run history list per job. Every change
is one compare-and-set Lua script (``fermix_shared/lua/put_job.lua``): it writes only if the
record is still the one the caller read, so concurrent writers (two scheduler ticks during a
beat failover, the CLI, an agent tool) retry on fresh state or give up, never overwrite each
other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from fermix_shared import keys, lua
from fermix_shared.errors import UserInputError
from fermix_shared.scheduling.jobs import Job, JobRun, first_run, now_ms

# Attempts of a read-modify-write before giving up (only contention makes it retry).
_CAS_ATTEMPTS = 20


class JobNotFound(UserInputError):
    """No job has that name."""

    def __init__(self, name: str):
        super().__init__(f"no scheduled job named {name!r}")
        self.name = name


class JobExists(UserInputError):
    """A job with that name exists already (and replacing it was not asked for)."""

    def __init__(self, name: str):
        super().__init__(f"a scheduled job named {name!r} already exists")


async def jobs_async(r: aioredis.Redis) -> list[Job]:
    """Every job, by name, over an asyncio client (the gateway's status read). A record this
    release cannot read (another version) is left out, never half-read."""
    out = []
    for raw in await r.hvals(keys.sched_jobs()):
        try:
            out.append(Job.model_validate_json(raw))
        except ValidationError:
            continue
    return sorted(out, key=lambda j: j.name)


def due_score(job: Job) -> int | None:
    """The job's score in the due index, or None when it cannot fire."""
    return job.next_run_at if job.enabled and not job.paused else None


class JobStore:
    """Scheduled jobs over a synchronous Redis client (``decode_responses=True``)."""

    def __init__(self, r: redis.Redis):
        self._r = r

    def cas(self, name: str, expected: str | None, new: Job | None,
            run: JobRun | None = None) -> bool:
        """Write ``new`` (None deletes the job and its history) and prepend ``run`` to the
        history, only if the stored record is ``expected`` (None: the job must not exist)."""
        score = due_score(new) if new is not None else None
        res = lua.PUT_JOB(
            self._r, jobs=keys.sched_jobs(), due=keys.sched_due(), runs=keys.sched_runs(name),
            name=name, expected="" if expected is None else expected,
            record="" if new is None else new.model_dump_json(),
            next_run_ms="" if score is None else score,
            run="" if run is None else run.model_dump_json(), runs_cap=keys.SCHED_RUNS_KEEP,
        )
        return int(res) == 1

    def raw(self, name: str) -> str | None:
        out: Any = self._r.hget(keys.sched_jobs(), name)
        return out if out else None

    def get(self, name: str) -> Job | None:
        raw = self.raw(name)
        return Job.model_validate_json(raw) if raw else None

    def require(self, name: str) -> Job:
        job = self.get(name)
        if job is None:
            raise JobNotFound(name)
        return job

    def all(self) -> list[Job]:
        raw: Any = self._r.hvals(keys.sched_jobs())
        return sorted((Job.model_validate_json(x) for x in raw), key=lambda j: j.name)

    def add(self, job: Job, *, replace: bool = False, now: int | None = None) -> Job:
        """Store a new job (or replace one, keeping its history) with its first run set."""
        t = now if now is not None else now_ms()
        nxt = first_run(job, t) if job.enabled and not job.paused else None
        job = job.model_copy(update={"next_run_at": nxt})
        if replace:
            score = due_score(job)
            lua.PUT_JOB(self._r, jobs=keys.sched_jobs(), due=keys.sched_due(),
                        runs=keys.sched_runs(job.name), name=job.name, expected="*",
                        record=job.model_dump_json(),
                        next_run_ms="" if score is None else score, run="", runs_cap=0)
        elif not self.cas(job.name, None, job):
            raise JobExists(job.name)
        return job

    def update(self, name: str, change: Callable[[Job], Job], run: JobRun | None = None) -> Job:
        """Read, ``change``, write back (retrying if someone wrote in between)."""
        for _ in range(_CAS_ATTEMPTS):
            raw = self.raw(name)
            if raw is None:
                raise JobNotFound(name)
            new = change(Job.model_validate_json(raw))
            if self.cas(name, raw, new, run):
                return new
        raise RuntimeError(f"job {name!r} kept changing; gave up after {_CAS_ATTEMPTS} attempts")

    def remove(self, name: str) -> None:
        """Delete the job and its run history; a run in flight still finishes."""
        for _ in range(_CAS_ATTEMPTS):
            raw = self.raw(name)
            if raw is None:
                raise JobNotFound(name)
            if self.cas(name, raw, None):
                return
        raise RuntimeError(f"job {name!r} kept changing; gave up after {_CAS_ATTEMPTS} attempts")

    def pause(self, name: str) -> Job:
        return self.update(name, lambda j: j.model_copy(update={"paused": True, "next_run_at": None}))

    def resume(self, name: str, now: int | None = None) -> Job:
        """Un-pause, re-enable (a job disabled by failures starts over) and schedule it."""
        t = now if now is not None else now_ms()

        def change(job: Job) -> Job:
            done = job.schedule.kind == "at" and job.last_run_at is not None
            nxt = None if done else first_run(job, t)  # a one-shot that ran stays done
            return job.model_copy(update={
                "paused": False, "enabled": nxt is not None, "consecutive_failures": 0,
                "disabled_reason": None if nxt is not None else ("done" if done else "expired"),
                "next_run_at": nxt,
            })

        return self.update(name, change)

    def due(self, now: int, limit: int = 200) -> list[tuple[str, int]]:
        """Jobs whose next run is at or before ``now``, oldest first, with that time."""
        rows: Any = self._r.zrangebyscore(keys.sched_due(), "-inf", now, start=0, num=limit,
                                          withscores=True)
        return [(str(name), int(score)) for name, score in rows]

    def runs(self, name: str, limit: int = keys.SCHED_RUNS_KEEP) -> list[JobRun]:
        """The job's run history, newest first."""
        raw: Any = self._r.lrange(keys.sched_runs(name), 0, limit - 1)
        return [JobRun.model_validate_json(x) for x in raw]
