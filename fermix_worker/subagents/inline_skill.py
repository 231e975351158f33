"""``skill_run`` inside a subagent: the skill runs inline, in the subagent's own job.

A subagent cannot fan out (subagents never call subagents), yet the seed lets workers "run
skills". So in a subagent ``skill_run`` is an ordinary tool: it resolves the name as the fan-out
does (:func:`~fermix_worker.subagents.skill_run.resolve`: for the parent turn's agent, at the
subagent's trust or the skill's lower one) and runs the skill's bounded loop right there, in the
same job, under the same deadline and ``/stop``: the skill's prompt, tool list, policy classes,
model and iteration bound, narrowed by the subagent's own tools (never wider). The skill's loop
gets neither ``skill_run`` nor ``subagents`` (a skill cannot call skill_run again) and cannot
park: its calls that need a person's approval are refused. Its answer is the call's result, as
a fanned-out skill run's is (capped, and fenced for a plugin skill).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fermix_shared.agents.definitions import turn_agent
from fermix_shared.models import lower_trust
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillSnapshot
from fermix_worker.subagents.caps import SubagentCaps
from fermix_worker.subagents.job import SubagentJob
from fermix_worker.subagents.prompts import DEFAULT_RESULT_FORMAT
from fermix_worker.subagents.results import SubagentReport
from fermix_worker.subagents.skill_run import SkillTarget, resolve, skill_result, skill_scope
from fermix_worker.subagents.skill_tool import DESCRIPTION, NAME, PARAMETERS, parse_skill_args
from fermix_worker.subagents.tool import ArgsError
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.context import RunContext

# Runs a skill's job in the calling subagent's job, within ``seconds``: its report.
RunNested = Callable[[SubagentJob, float], SubagentReport]


def nested_job(job: SubagentJob, target: SkillTarget, task: str, caps: SubagentCaps
               ) -> SubagentJob:
    """The skill's run as a job derived from the subagent's own: its limits on top of the
    subagent's (which already carry the parent turn's)."""
    tools, policies = skill_scope(target, job.allowed_tools, job.policies)
    iterations = min(caps.max_iterations, target.max_iterations or caps.max_iterations)
    return job.model_copy(update={
        "task": task, "trust": target.trust, "result_format": DEFAULT_RESULT_FORMAT,
        "skill": target.name, "system": target.system, "allowed_tools": tools,
        "policies": policies, "provider": target.provider or job.provider,
        "model": target.model or job.model,
        "reasoning_effort": target.reasoning_effort, "temperature": target.temperature,
        "max_iterations": iterations,
    })


def inline_skill_run(job: SubagentJob, settings: Settings, caps: SubagentCaps,
                     skills: Callable[[], SkillSnapshot | None], remaining: Callable[[], float],
                     run: RunNested) -> Tool:
    """``skill_run`` for the subagent of ``job`` (``remaining``: seconds its job has left)."""

    def call(ctx: RunContext, arguments: dict[str, Any]) -> str:
        try:
            args = parse_skill_args(arguments)
            caller = turn_agent(settings.agents, job.parent_agent)
            trust = lower_trust(job.trust, caller.trust)
            target = resolve(args.name, caller, trust, skills(), settings.agents)
        except ArgsError as e:
            raise ToolError(str(e).removeprefix("Error: ")) from None
        seconds = min(remaining(), target.timeout_s or caps.timeout_s)
        ctx.audit.record("agent", "skill_run.inline", "ok", skill=target.name, trust=target.trust)
        report = run(nested_job(job, target, args.task, caps), seconds)
        result = skill_result(target.name, report, caps.result_bytes, target.fenced)
        if result.is_error:
            raise ToolError(result.content.removeprefix("Error: "))
        return result.content

    return Tool(name=NAME, description=DESCRIPTION, parameters=PARAMETERS, run=call,
                policy="read_only", idempotent=False,
                # The skill's own loop bounds it (the job's deadline); this only backs it up.
                timeout_s=max(1.0, remaining()) + 5.0)
