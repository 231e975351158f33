"""``fermix schedule ...``: manage scheduled jobs straight in Redis (``FERMIX_REDIS_URL``).

Jobs made here run at operator trust, as the agent ``--agent`` names (default ``default``),
inside that agent's limits (its trust, policy classes and tool list). Bad arguments (a
schedule that is not exactly one of ``--cron``/``--every``/``--at``, a bad cron expression
or zone, a past ``--at``, a bad ``--deliver``, an agent that is not declared or is a ``sub``
agent) exit 2 with one sentence; a missing or existing job, or an unreachable Redis, exit 1.
``list`` and ``runs`` are aligned columns, a table with coloured states on a terminal;
``--json`` prints the jobs or runs as JSON; on ``pause``/``resume`` the job, on ``rm`` and
``run-now`` ``{"ok": true, ...}`` naming the job (and the run started).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import redis

from fermix_cli import output
from fermix_shared import audit
from fermix_shared.errors import UserInputError
from fermix_shared.scheduling.jobs import Job, JobRun, ms_to_iso
from fermix_shared.scheduling.parse import check_agent, make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobExists, JobNotFound, JobStore

# Who a change made here is audited as (fermix_shared/audit/).
CLI_ACTOR = "cli"


def _store() -> tuple[redis.Redis, JobStore]:
    from fermix_shared.redis.client import cli_redis

    r = cli_redis()
    return r, JobStore(r)


def _int(raw: str | None, what: str) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise UserInputError(f"{what} must be a whole number of seconds, not {raw!r}") from None


def _add(a: argparse.Namespace) -> int:
    from fermix_shared.settings import get_settings

    # The schedule first: an --at is checked against the clock before settings load.
    schedule = make_schedule(cron_expr=a.cron, tz=a.tz, every_s=_int(a.every, "--every"), at=a.at)
    settings = get_settings()
    agent = check_agent(a.agent, settings.agents)
    tools = [t.strip() for t in a.tools.split(",") if t.strip()] if a.tools is not None else None
    job = new_job(
        name=a.name, message=a.message, schedule=schedule,
        delivery=parse_delivery(a.deliver, None), trust="operator", created_by="cli",
        allowed_tools=tools, timeout_s=_int(a.timeout, "--timeout"), expires_at=a.expires,
        max_timeout_s=settings.turn_timeout, agent=agent,
    )
    if a.paused:
        job = job.model_copy(update={"paused": True})
    r, store = _store()
    job = store.add(job, replace=a.replace)
    audit.record(r, "admin", "schedule.create", "ok", actor=CLI_ACTOR, job=job.name,
                 agent=job.agent, replace=bool(a.replace), schedule=job.schedule.describe(),
                 message_sha256=audit.text_digest(job.message))
    output.done(a, f"Scheduled job '{job.name}' (agent {job.agent}): "
                   f"{job.schedule.describe()}, {job.state}, next run "
                   f"{ms_to_iso(job.next_run_at)}, delivers to {job.delivery.describe()}.",
                _job_json(job))
    return 0


def _job_json(job: Job) -> dict[str, object]:
    return {**job.model_dump(mode="json"), "state": job.state}


def _list(a: argparse.Namespace) -> int:
    jobs = _store()[1].all()
    if a.json:
        output.print_json([_job_json(j) for j in jobs])
        return 0
    if not jobs:
        print("No scheduled jobs.")
        return 0
    rows: list[tuple[str, ...]] = [
        ("NAME", "AGENT", "SCHEDULE", "STATE", "NEXT RUN", "LAST RUN", "DELIVERY", "FAILS")]
    rows += [(j.name, j.agent, j.schedule.describe(), j.state, ms_to_iso(j.next_run_at),
              ms_to_iso(j.last_run_at), j.delivery.describe(), str(j.consecutive_failures))
             for j in jobs]
    _table(rows, state=3)
    return 0


def _table(rows: list[tuple[str, ...]], state: int) -> None:
    """The header row and its rows: aligned columns, or a table on a terminal (the column
    ``state`` coloured)."""
    if (console := output.terminal()) is not None:
        output.table(console, rows[0], [[output.state(c) if i == state else c
                                         for i, c in enumerate(row)] for row in rows[1:]])
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _run_row(run: JobRun) -> tuple[str, ...]:
    took = "-" if run.started_at is None else f"{(run.ended_at - run.started_at) / 1000:.1f}s"
    output = " ".join(run.output.split())
    return (ms_to_iso(run.started_at or run.ended_at), run.status, run.trigger, took,
            f"{run.input_tokens}+{run.output_tokens}", run.delivery,
            output[:60] + ("…" if len(output) > 60 else ""))


def _runs(a: argparse.Namespace) -> int:
    store = _store()[1]
    store.require(a.name)
    history = store.runs(a.name, _int(a.limit, "--limit") or 50)
    if a.json:
        output.print_json([r.model_dump(mode="json") for r in history])
    elif not history:
        print(f"Job '{a.name}' has not run yet.")
    else:
        _table([("STARTED", "STATUS", "TRIGGER", "TOOK", "TOKENS", "DELIVERY", "OUTPUT"),
                *(_run_row(r) for r in history)], state=1)
    return 0


def _rm(a: argparse.Namespace) -> int:
    r, store = _store()
    store.remove(a.name)
    audit.record(r, "admin", "schedule.remove", "ok", actor=CLI_ACTOR, job=a.name)
    output.done(a, f"Removed job '{a.name}'.", removed=a.name)
    return 0


def _pause(a: argparse.Namespace) -> int:
    r, store = _store()
    job = store.pause(a.name)
    audit.record(r, "admin", "schedule.pause", "ok", actor=CLI_ACTOR, job=job.name)
    output.done(a, f"Paused job '{job.name}'.", _job_json(job))
    return 0


def _resume(a: argparse.Namespace) -> int:
    r, store = _store()
    job = store.resume(a.name)
    audit.record(r, "admin", "schedule.resume", "ok", actor=CLI_ACTOR, job=job.name)
    output.done(a, f"Resumed job '{job.name}': {job.state}, next run "
                f"{ms_to_iso(job.next_run_at)}.", _job_json(job))
    return 0


def _run_now(a: argparse.Namespace) -> int:
    from fermix_shared.scheduling.firing import enqueue_run, kick_dispatch

    r, store = _store()
    accepted = enqueue_run(r, store.require(a.name), kick_dispatch, scheduled_for=None)
    audit.record(r, "admin", "schedule.run_now", "ok", actor=CLI_ACTOR, job=a.name,
                 started_run=accepted.run_id)
    output.done(a, f"Started a run of job '{a.name}': {accepted.run_id}", job=a.name,
                runId=accepted.run_id)
    return 0


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A missing or existing job and an unreachable Redis are failures (exit 1)."""

    def run(a: argparse.Namespace) -> int:
        try:
            return func(a)
        except (JobNotFound, JobExists) as e:
            print(f"fermix: {e}", file=sys.stderr)
            return 1
        except redis.RedisError as e:
            print(f"fermix: cannot reach Redis ({e})", file=sys.stderr)
            return 1

    return run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``schedule`` and its subcommands on the ``fermix`` parser."""
    sched = sub.add_parser("schedule", help="scheduled jobs (stored in Redis)").add_subparsers(
        dest="schedule_command", required=True)
    add = sched.add_parser("add", help="create a job: exactly one of --cron, --every, --at")
    add.add_argument("name")
    add.add_argument("--cron", help="5-field cron expression, e.g. '0 9 * * 1-5'")
    add.add_argument("--tz", help="IANA time zone for --cron or a naive --at (default UTC)")
    add.add_argument("--every", metavar="SECONDS", help="fixed interval in seconds")
    add.add_argument("--at", metavar="ISO8601", help="run once at this time")
    add.add_argument("--message", "-m", required=True, help="the task prompt")
    add.add_argument("--deliver", metavar="CHANNEL:CHAT_ID[:THREAD]",
                     help="telegram:CHAT_ID[:TOPIC] or slack:CHANNEL[:THREAD_TS] (default: none)")
    add.add_argument("--agent", default="default",
                     help="the agent the job runs as, inside its limits (default: default)")
    add.add_argument("--tools",
                     help="comma-separated allowed tools, within the agent's (default: all "
                          "the agent's; '' = none)")
    add.add_argument("--timeout", metavar="SECONDS", help="per-run timeout (default 300)")
    add.add_argument("--expires", metavar="ISO8601", help="no runs at or after this time")
    add.add_argument("--paused", action="store_true", help="create it paused")
    add.add_argument("--replace", action="store_true", help="replace a job of that name")
    output.add_json_flag(add, "print the job as JSON")
    add.set_defaults(func=_guarded(_add))
    ls = sched.add_parser("list", help="jobs with their state and next run")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_guarded(_list))
    runs = sched.add_parser("runs", help="a job's run history, newest first")
    runs.add_argument("name")
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--limit", default=None)
    runs.set_defaults(func=_guarded(_runs))
    for name, func, text in (("rm", _rm, "delete a job and its history"),
                             ("pause", _pause, "stop a job firing until resumed"),
                             ("resume", _resume, "resume a paused or disabled job"),
                             ("run-now", _run_now, "run a job once now")):
        p = sched.add_parser(name, help=text)
        p.add_argument("name")
        output.add_json_flag(p)
        p.set_defaults(func=_guarded(func))
