"""Scheduling tools: the agent creates and manages scheduled jobs from a conversation.

``schedule_job``, ``pause_job``, ``resume_job``, ``remove_job`` and ``run_job_now`` change
state (``read_write``: guests never see them); ``list_jobs`` is ``read_only``. A job created
here runs as the calling turn's agent, at its trust, and by default delivers back to the
calling conversation. Its ``allowed_tools`` may name only tools the calling turn is offered
(a wider list is refused); without one, the job keeps the calling turn's own tool subset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from pydantic import ValidationError

from fermix_shared import audit
from fermix_shared.agents.definitions import DEFAULT_AGENT
from fermix_shared.errors import UserInputError
from fermix_shared.scheduling.firing import enqueue_run
from fermix_shared.scheduling.jobs import Job, ms_to_iso
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.context import RunContext, TurnContext

_NAME = {"type": "string", "description": "job name: 1-64 letters, digits, '_', '.', '-'"}
_BY_NAME: dict[str, Any] = {"type": "object", "properties": {"name": _NAME}, "required": ["name"]}


def _caller(ctx: RunContext) -> TurnContext:
    if ctx.turn is None:
        raise ToolError("scheduling tools need a calling conversation")
    return ctx.turn


def _name(args: dict[str, Any]) -> str:
    name = str(args.get("name") or "").strip()
    if not name:
        raise ToolError("name is required")
    return name


def _number(args: dict[str, Any], key: str) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ToolError(f"{key} must be a number of seconds, not {value!r}") from None


def _job_tools(args: dict[str, Any], ctx: TurnContext) -> list[str] | None:
    """The job's tool subset: the one asked for, if the calling turn may use every tool in
    it; else the calling turn's own subset (None: none)."""
    asked = args.get("allowed_tools")
    if asked is None:
        return None if ctx.allowed_tools is None else list(ctx.allowed_tools)
    if not isinstance(asked, list) or not all(isinstance(t, str) for t in asked):
        raise ToolError("allowed_tools must be a list of tool names")
    if ctx.offers is None:
        raise ToolError("allowed_tools cannot be checked against this conversation's tools")
    wider = [t for t in dict.fromkeys(asked) if not ctx.offers(t)]
    if wider:
        raise ToolError(
            "allowed_tools may name only tools this conversation can use; not available "
            f"here: {', '.join(wider)}")
    return list(dict.fromkeys(asked))


def _summary(job: Job) -> str:
    agent = "" if job.agent == DEFAULT_AGENT else f"runs as agent {job.agent}, "
    return (f"'{job.name}': {agent}{job.schedule.describe()}, {job.state}, next run "
            f"{ms_to_iso(job.next_run_at)}, delivers to {job.delivery.describe()}")


class ScheduleTools:
    """The tools over a lazily obtained Redis client and a dispatch ``kick``."""

    def __init__(self, redis_client: Callable[[], redis.Redis], kick: Callable[[str], None],
                 max_timeout_s: float):
        self._redis = redis_client
        self._kick = kick
        self._max_timeout = max_timeout_s

    def _store(self) -> JobStore:
        return JobStore(self._redis())

    def schedule_job(self, ctx: RunContext, args: dict[str, Any]) -> str:
        turn = _caller(ctx)
        every, timeout = _number(args, "every_seconds"), _number(args, "timeout_seconds")
        try:
            tools = _job_tools(args, turn)
        except ToolError:
            ctx.audit.record("admin", "schedule.create", "error", job=str(args.get("name")),
                             reason="allowed_tools")
            raise
        try:
            schedule = make_schedule(
                cron_expr=args.get("cron") or None, tz=args.get("tz") or None,
                every_s=int(every) if every is not None else None, at=args.get("at") or None)
            job = new_job(
                name=_name(args), message=str(args.get("message") or ""), schedule=schedule,
                delivery=parse_delivery(args.get("deliver") or "origin", turn.origin),
                trust=turn.trust, created_by=f"{turn.key.channel}:{turn.sender_id}",
                agent=turn.agent, allowed_tools=tools,
                timeout_s=timeout, expires_at=args.get("expires_at") or None,
                max_timeout_s=self._max_timeout)
            job = self._store().add(job, replace=bool(args.get("replace")))
        except (UserInputError, ValidationError, ValueError) as e:
            ctx.audit.record("admin", "schedule.create", "error", job=str(args.get("name")))
            raise ToolError(str(e)) from e
        ctx.audit.record("admin", "schedule.create", "ok", job=job.name, agent=job.agent,
                         replace=bool(args.get("replace")), schedule=job.schedule.describe(),
                         message_sha256=audit.text_digest(job.message))
        return f"Scheduled job {_summary(job)}."

    def list_jobs(self, ctx: RunContext, args: dict[str, Any]) -> str:
        jobs = self._store().all()
        if not jobs:
            return "No scheduled jobs."
        show_task = _caller(ctx).trust == "operator"
        lines = [_summary(j) + (f"; task: {j.message[:120]!r}" if show_task else "") for j in jobs]
        return "\n".join(lines)

    def _change(self, ctx: RunContext, args: dict[str, Any], verb: str) -> str:
        store = self._store()
        action = {"removed": "schedule.remove", "paused": "schedule.pause",
                  "resumed": "schedule.resume"}[verb]
        try:
            if verb == "removed":
                store.remove(_name(args))
                ctx.audit.record("admin", action, "ok", job=_name(args))
                return f"Removed job '{_name(args)}'."
            job = store.pause(_name(args)) if verb == "paused" else store.resume(_name(args))
        except UserInputError as e:
            ctx.audit.record("admin", action, "error", job=str(args.get("name")))
            raise ToolError(str(e)) from e
        ctx.audit.record("admin", action, "ok", job=job.name)
        return f"{verb.capitalize()} job {_summary(job)}."

    def run_job_now(self, ctx: RunContext, args: dict[str, Any]) -> str:
        try:
            job = self._store().require(_name(args))
        except UserInputError as e:
            raise ToolError(str(e)) from e
        accepted = enqueue_run(self._redis(), job, self._kick, scheduled_for=None)
        ctx.audit.record("admin", "schedule.run_now", "ok", job=job.name,
                         started_run=accepted.run_id)
        return f"Started a run of job '{job.name}' now (run {accepted.run_id})."

    def tools(self) -> list[Tool]:
        return [
            Tool("schedule_job", (
                "Create a scheduled job: the agent runs `message` as a task on a schedule, "
                "in its own conversation. Give exactly one of cron (5 fields, with tz, an "
                "IANA zone), every_seconds, or at (ISO-8601, once). deliver: 'origin' (this "
                "conversation, default), 'none', or 'telegram:CHAT_ID[:THREAD]' / "
                "'slack:CHANNEL[:THREAD_TS]'. Answer NO_REPLY in a run to send nothing. "
                "The job runs as you, with your tools at most; allowed_tools narrows them."),
                {"type": "object", "properties": {
                    "name": _NAME, "message": {"type": "string", "description": "the task prompt"},
                    "cron": {"type": "string"}, "tz": {"type": "string"},
                    "every_seconds": {"type": "integer", "minimum": 1},
                    "at": {"type": "string"}, "deliver": {"type": "string"},
                    "allowed_tools": {"type": "array", "items": {"type": "string"}},
                    "timeout_seconds": {"type": "number"}, "expires_at": {"type": "string"},
                    "replace": {"type": "boolean", "description": "replace a job of that name"},
                }, "required": ["name", "message"]},
                self.schedule_job, policy="read_write", idempotent=False),
            Tool("list_jobs", "List the scheduled jobs with their schedule, state and next run.",
                 {"type": "object", "properties": {}}, self.list_jobs),
            Tool("pause_job", "Pause a scheduled job (it keeps its history).", _BY_NAME,
                 lambda ctx, a: self._change(ctx, a, "paused"), policy="read_write"),
            Tool("resume_job", "Resume a paused or disabled scheduled job.", _BY_NAME,
                 lambda ctx, a: self._change(ctx, a, "resumed"), policy="read_write"),
            Tool("remove_job", "Delete a scheduled job and its run history.", _BY_NAME,
                 lambda ctx, a: self._change(ctx, a, "removed"), policy="read_write"),
            Tool("run_job_now", "Run a scheduled job once now, outside its schedule.", _BY_NAME,
                 self.run_job_now, policy="read_write", idempotent=False),
        ]


def schedule_tools(redis_client: Callable[[], redis.Redis], kick: Callable[[str], None],
                   max_timeout_s: float) -> list[Tool]:
    """The six scheduling tools (see the module docstring)."""
    return ScheduleTools(redis_client, kick, max_timeout_s).tools()
