"""CeleryFanOut: the :class:`~fermix_worker.subagents.contract.FanOut` that runs a ``subagents`` call as
``chord(group(fermix.subagents.run x N), fermix.subagents.resume)``, and a ``skill_run`` call as
the same chord with one header task (:mod:`fermix_worker.subagents.skill_run`).

The parked turn's deadline covers every wave of the call (``ceil(tasks / concurrency)`` times
the per-worker timeout, plus queueing slack) and a margin for the callback. A call the caps
refuse (bad arguments, too many tasks, a skill the caller may not run) starts no subagent: the
callback is sent at once with the error, so the model reads it as the call's result. Every job
carries what its subagent may reach of the parked turn: its workspace root (read-only) and the
chat where the subagent's approvals are asked.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery, chord, group
from pydantic import BaseModel

from fermix_shared import tracing
from fermix_shared.agents.definitions import turn_agent
from fermix_shared.messages import ToolCall
from fermix_shared.models import RunProfile, lower_trust
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry
from fermix_shared.task_names import SUBAGENT_RESUME_TASK, SUBAGENT_RUN_TASK
from fermix_worker.approvals.policy import chat_to_ask
from fermix_worker.subagents import skill_tool
from fermix_worker.subagents.caps import CALLBACK_MARGIN_S, SubagentCaps, caps_for
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.subagents.job import SubagentJob
from fermix_worker.subagents.skill_run import resolve, skill_job
from fermix_worker.subagents.tool import NAME, ArgsError, parse_args, task_count
from fermix_worker.tools.context import AuditRecorder
from fermix_worker.tools.workspace import workspace_root

log = logging.getLogger(__name__)


class FanOutMeta(BaseModel):
    """What the chord callback needs besides the header results (or the refusal)."""

    fanout_id: str
    conv: str
    run_id: str
    call_id: str
    # The fan-out tool called: ``subagents`` or ``skill_run``.
    tool: str = NAME
    tasks: list[str] = []
    result_bytes: int = 0
    # Set when the call was refused before anything started: the call's error result.
    refused: str = ""
    # ``skill_run``: what ran, and whether its answer goes back fenced.
    skill: str = ""
    fenced: bool = False
    # The fan-out's span context (fermix_shared/tracing.py), as its jobs carry it too.
    trace: dict[str, str] | None = None


class CeleryFanOut:
    """Builds and launches the chord for a parked turn's ``subagents`` or ``skill_run`` call.
    ``skills`` is the process's skill registry (``skill_run`` resolves names in it); without
    one, ``skill_run`` finds only ``sub`` agents."""

    def __init__(self, app: Celery, settings: Settings,
                 skills: Callable[[], SkillRegistry] | None = None):
        self._app = app
        self._settings = settings
        self._skills = skills

    def _caps(self, profile: RunProfile) -> SubagentCaps:
        return caps_for(profile, self._settings.subagent_timeout_seconds)

    def deadline(self, call: ToolCall, profile: RunProfile) -> float:
        """Seconds the parked turn may wait for the callback."""
        caps = self._caps(profile)
        if call.name == skill_tool.NAME:
            return caps.park_s(1)
        tasks = min(task_count(call.arguments), caps.max_tasks)
        return caps.park_s(tasks) if tasks else CALLBACK_MARGIN_S

    def launch(self, request: FanOutRequest, recorder: AuditRecorder) -> None:
        """Start the call's chord (or send its refusal to the callback at once), inside the
        call's tool span: the subagents' spans are its children, on whichever worker."""
        with tracing.span(f"execute_tool {request.call.name}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": request.call.name,
            "gen_ai.tool.call.id": request.call.id, "gen_ai.tool.type": "function",
            "fermix.run_id": request.run_id,
        }) as span:
            meta = FanOutMeta(fanout_id=uuid.uuid4().hex, conv=request.conv,
                              run_id=request.run_id, call_id=request.call.id,
                              tool=request.call.name, trace=tracing.inject())
            jobs = self._launch(request, recorder, meta)
            span.set_attributes({"fermix.fanout_id": meta.fanout_id, "fermix.subagents": jobs,
                                 "fermix.tool.outcome": "refused" if meta.refused else "ok"})

    def _launch(self, request: FanOutRequest, recorder: AuditRecorder, meta: FanOutMeta) -> int:
        """The chord of ``meta``'s call, launched; how many subagents it started."""
        caps = self._caps(request.profile)
        # The turn's registry permitted the call (the loop parks only for a tool it offers):
        # a passed capability check, as for every call the registry runs itself.
        recorder.record("check", meta.tool, "pass", check="scope", call_id=meta.call_id[:64])
        try:
            if request.call.name == skill_tool.NAME:
                jobs = [self.plan_skill_run(request, caps, meta)]
            else:
                jobs = self._subagent_jobs(request, caps, meta)
        except ArgsError as e:
            meta.refused = str(e)
            recorder.record("agent", f"{meta.tool}.spawn", "error", fanout_id=meta.fanout_id,
                            reason=meta.refused)
            self._app.send_task(SUBAGENT_RESUME_TASK, args=[[], meta.model_dump()])
            return 0
        reach = {**self._reach(request), "trace": meta.trace}
        header = group(self._signature(SUBAGENT_RUN_TASK, job.model_copy(update=reach).model_dump())
                       for job in jobs)
        callback = self._signature(SUBAGENT_RESUME_TASK, meta.model_dump())
        chord(header, callback, app=self._app).apply_async()
        recorder.record("agent", f"{meta.tool}.spawn", "ok", fanout_id=meta.fanout_id,
                        subagents=len(jobs), skill=meta.skill or None,
                        concurrency=jobs[0].concurrency, trust=jobs[0].trust)
        log.info("fan-out %s (%s) for %s: %d subagents, %d at a time, %s trust",
                 meta.fanout_id, meta.skill or meta.tool, request.run_id, len(jobs),
                 jobs[0].concurrency, jobs[0].trust)
        return len(jobs)

    def _reach(self, request: FanOutRequest) -> dict[str, Any]:
        """What the subagents may reach of the parked turn: its workspace (they read it) and
        its chat (their approvals are asked there)."""
        parent = request.parent_turn()
        return {"workspace": workspace_root(self._settings, parent),
                "ask_in": chat_to_ask(parent.origin)}

    def _subagent_jobs(self, request: FanOutRequest, caps: SubagentCaps,
                       meta: FanOutMeta) -> list[SubagentJob]:
        """The jobs of a ``subagents`` call. Raises :class:`ArgsError` when refused."""
        args = parse_args(request.call.arguments, caps, ultra=request.profile == "ultra")
        meta.tasks, meta.result_bytes = args.tasks, caps.result_bytes
        budget = caps.budget_s(len(args.tasks))
        parent_tools, parent_policies = request.parent_limits()
        return [
            SubagentJob(
                fanout_id=meta.fanout_id, index=i, task=task, conv=request.conv,
                parent_run=request.run_id, trust=request.trust, profile=request.profile,
                result_format=args.result_format, parent_model=request.model,
                parent_tools=parent_tools, parent_policies=parent_policies,
                allowed_tools=None if args.tools is None else list(args.tools),
                provider=args.provider, model=args.model,
                reasoning_effort=args.reasoning_effort, concurrency=caps.concurrency,
                timeout_s=caps.timeout_s, deadline_at=time.time() + budget,
                slots_ttl_s=budget + CALLBACK_MARGIN_S, parent_agent=request.agent,
                parent_user=request.user,
            )
            for i, task in enumerate(args.tasks)
        ]

    def plan_skill_run(self, request: FanOutRequest, caps: SubagentCaps,
                       meta: FanOutMeta) -> SubagentJob:
        """The one job of a ``skill_run`` call; ``meta`` gets what the callback needs.
        Raises :class:`ArgsError` (the error result) when the call is refused."""
        args = skill_tool.parse_skill_args(request.call.arguments)
        caller = turn_agent(self._settings.agents, request.agent)
        trust = lower_trust(request.trust, caller.trust)
        snapshot = self._skills().current() if self._skills is not None else None
        target = resolve(args.name, caller, trust, snapshot, self._settings.agents)
        meta.tasks, meta.result_bytes = [args.task], caps.result_bytes
        meta.skill, meta.fenced = target.name, target.fenced
        return skill_job(target, args, request, caps, meta.fanout_id)

    def _signature(self, name: str, arg: dict[str, Any]) -> Any:
        return self._app.signature(name, args=[arg])
