"""``skill_run``: a skill (or a ``sub`` agent) run as one bounded worker agent on the fleet.

A skill is a specialization of an agent definition (role ``sub``, not persistent), so a run is
a subagent job of its own (:class:`SkillTarget` -> :class:`SubagentJob`): a Celery chord of one
header task, the parent parked meanwhile, under the regular subagent caps. What it resolves to
is decided at launch, on the parent's worker, from that worker's registry snapshot; the job
carries everything the run needs, so the worker that runs it needs no copy of the skill.

Resolution of ``name``, for the calling agent (``AgentDefinition.delegates``: ``None`` any,
``[]`` none, else only those names):

1. a skill the caller's trust may see: its instructions are the system prompt, its
   ``allowed_tools``, ``policy`` and ``model`` bound the run;
2. else a ``[[agents]]`` entry with ``role = "sub"``: its system prompt, tools, policy, route,
   reasoning effort, temperature, iterations and timeout (the last two capped by the
   subagent caps).

Trust is ``lower_trust(target, caller)``; the run is bounded by the calling turn's tools
(its agent's tool list and policy classes, carried in the job as for ``subagents``), then by
the target's tool list and policy classes, minus what no subagent gets. Nothing ever widens: a
plugin skill (guest) asking for ``exec`` or ``read_write`` still gets ``read_only`` tools
only, and a skill listing ``http_fetch`` run by an agent without it gets no ``http_fetch``.

The model reads the run's answer itself (a plugin skill's inside the untrusted-content fence,
since plugin instructions steered it), or ``Error: ...`` with the reason it did not complete.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.models import PolicyClass, Trust, lower_trust
from fermix_shared.skills import Skill, SkillSnapshot
from fermix_worker.subagents.caps import CALLBACK_MARGIN_S, QUEUE_SLACK_S, SubagentCaps
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.subagents.job import SubagentJob
from fermix_worker.subagents.prompts import DEFAULT_RESULT_FORMAT, SUBAGENT_SYSTEM_PROMPT
from fermix_worker.subagents.results import SubagentReport, cut_utf8
from fermix_worker.subagents.skill_tool import SkillRunArgs
from fermix_worker.subagents.tool import ArgsError, ReasoningEffort
from fermix_worker.tools.base import ToolResult
from fermix_worker.tools.fence import fence
from fermix_worker.tools.policy import ALL_POLICIES, narrowed

RUN_NOTE = (
    "You are running the {kind} '{name}' for another agent, as a temporary worker: you have no "
    "contact with the user, so do not ask questions. Follow the instructions above on the task "
    "you are given, use as few tool calls as you can, and end with your result: your final "
    "message goes back to the agent that asked, as the {kind}'s answer."
)
_FAILED: dict[str, str] = {
    "failed": "failed", "timed_out": "timed out", "cancelled": "was cancelled"}


@dataclass(frozen=True)
class SkillTarget:
    """What one ``skill_run`` call runs, resolved at launch (see the module docstring)."""

    name: str
    kind: Literal["skill", "agent"]
    system: str
    trust: Trust
    # None: the trust's tools / classes; never wider than the caller's.
    allowed_tools: tuple[str, ...] | None = None
    policies: tuple[PolicyClass, ...] | None = None
    provider: Literal["anthropic", "openai"] | None = None
    model: str | None = None
    reasoning_effort: ReasoningEffort | None = None
    temperature: float | None = None
    max_iterations: int | None = None
    timeout_s: float | None = None
    # The answer goes back fenced (a plugin skill's instructions steered the run).
    fenced: bool = False


def _policies(*limits: Iterable[str] | None) -> tuple[PolicyClass, ...] | None:
    """The classes every limit allows (``None``: no limit at all)."""
    if all(limit is None for limit in limits):
        return None
    allowed = set(ALL_POLICIES)
    for limit in limits:
        if limit is not None:
            allowed &= set(limit)
    return tuple(sorted(p for p in ALL_POLICIES if p in allowed))


def skill_scope(target: SkillTarget, tools: list[str] | None, policies: list[PolicyClass] | None
                ) -> tuple[list[str] | None, list[PolicyClass] | None]:
    """``target``'s tool list and policy classes on top of a run's own (``None``: no limit):
    a skill run inside a subagent, narrowed by both."""
    allowed = narrowed(None if tools is None else tuple(tools), target.allowed_tools)
    classes = _policies(policies, target.policies)
    return (None if allowed is None else list(allowed)), (None if classes is None else list(classes))


def _from_skill(skill: Skill, caller: AgentDefinition, trust: Trust) -> SkillTarget:
    note = RUN_NOTE.format(kind="skill", name=skill.name)
    return SkillTarget(
        name=skill.name, kind="skill",
        system=f"{skill.instructions}\n\n{note}",
        trust=lower_trust(skill.trust, trust),
        allowed_tools=skill.allowed_tools,
        policies=_policies(caller.policy, skill.policy),
        model=skill.model,
        fenced=skill.trust == "guest",
    )


def _from_agent(agent: AgentDefinition, caller: AgentDefinition, trust: Trust) -> SkillTarget:
    note = RUN_NOTE.format(kind="agent", name=agent.name)
    return SkillTarget(
        name=agent.name, kind="agent",
        system=f"{agent.system_prompt or SUBAGENT_SYSTEM_PROMPT}\n\n{note}",
        trust=lower_trust(agent.trust, trust),
        allowed_tools=None if agent.allowed_tools is None else tuple(agent.allowed_tools),
        policies=_policies(caller.policy, agent.policy),
        provider=agent.provider, model=agent.model, reasoning_effort=agent.reasoning_effort,
        temperature=agent.temperature, max_iterations=agent.max_iterations, timeout_s=agent.timeout_seconds,
    )


def resolve(name: str, caller: AgentDefinition, trust: Trust, skills: SkillSnapshot | None,
            agents: list[AgentDefinition]) -> SkillTarget:
    """What ``caller`` (running at ``trust``) runs as ``name``. Raises :class:`ArgsError`
    (its text is the result the model reads) when it may not run it or nothing is called so."""
    if caller.delegates is not None and name not in caller.delegates:
        allowed = ", ".join(caller.delegates) or "none"
        raise ArgsError(f"Error: agent '{caller.name}' may not run '{name}' "
                        f"(the skills and agents it may run: {allowed})")
    skill = skills.get(name, trust) if skills is not None else None
    if skill is not None:
        return _from_skill(skill, caller, trust)
    sub = next((a for a in agents if a.name == name and a.role == "sub"), None)
    if sub is not None:
        return _from_agent(sub, caller, trust)
    raise ArgsError(f"Error: no skill named {name!r}; skill_list shows the available ones")


def skill_job(target: SkillTarget, args: SkillRunArgs, request: FanOutRequest,
              caps: SubagentCaps, fanout_id: str) -> SubagentJob:
    """The one subagent job of a ``skill_run`` call (bounded by ``caps``)."""
    timeout_s = min(caps.timeout_s, target.timeout_s or caps.timeout_s)
    budget = timeout_s + QUEUE_SLACK_S
    iterations = min(caps.max_iterations, target.max_iterations or caps.max_iterations)
    parent_tools, parent_policies = request.parent_limits()
    return SubagentJob(
        fanout_id=fanout_id, index=0, task=args.task, conv=request.conv,
        parent_run=request.run_id, trust=target.trust, profile=request.profile,
        result_format=DEFAULT_RESULT_FORMAT, parent_model=request.model,
        parent_tools=parent_tools, parent_policies=parent_policies, provider=target.provider, model=target.model,
        reasoning_effort=target.reasoning_effort, concurrency=1, timeout_s=timeout_s,
        deadline_at=time.time() + budget, slots_ttl_s=budget + CALLBACK_MARGIN_S,
        skill=target.name, system=target.system,
        allowed_tools=None if target.allowed_tools is None else list(target.allowed_tools),
        policies=None if target.policies is None else list(target.policies),
        max_iterations=iterations, temperature=target.temperature,
        parent_agent=request.agent, parent_user=request.user,
    )


def skill_result(name: str, report: SubagentReport, result_bytes: int,
                 fenced: bool) -> ToolResult:
    """The call's result: the run's answer (cut to ``result_bytes``), or why there is none."""
    if report.status != "completed":
        why = _FAILED.get(report.status, report.status)
        return ToolResult(f"Error: skill '{name}' {why}: {report.error}", is_error=True)
    text, cut = cut_utf8(report.output, result_bytes)
    if cut:
        text += "\n[truncated]"
    return ToolResult(fence("skill_run", text) if fenced else text)
