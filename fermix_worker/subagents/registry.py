"""The tools a subagent may use: the parent turn's, at the parent's trust, minus what a
subagent must never do; never more than the parent had.

The parent's limits travel in the job (``parent_tools``, ``parent_policies``: its agent's tool
list and policy classes within its trust), so an agent with ``policy = ["read_only"]`` or
``allowed_tools = ["subagents"]`` fans out subagents bound by the same. Policy classes: the
parent's minus ``read_write`` and ``gui_control`` (:meth:`ToolScope.for_subagent`). Beyond
policy, a subagent gets no fan-out tool (no
recursion: a call to ``subagents`` gets an error as its result), no tool whose success is a
reply on the parent's channel (reactions, attachments), and none of the parent's memory tools.
Its ``skill_run`` runs the skill inline, in its own job
(:mod:`~fermix_worker.subagents.inline_skill`); inside a skill run (fanned out or inline)
``skill_run`` is refused like ``subagents``. A skill run narrows further, never wider: the
skill's tool list and policy classes are extra scopes every tool must also pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fermix_shared.messages import ToolCall
from fermix_shared.models import PolicyClass, Trust
from fermix_worker.approvals.policy import SUBAGENT_REFUSAL
from fermix_worker.subagents import skill_tool
from fermix_worker.subagents.prompts import NESTED_CALL_ERROR
from fermix_worker.subagents.tool import NAME
from fermix_worker.tools.base import (
    DEFAULT_TOOL_TIMEOUT_S,
    Tool,
    ToolRegistry,
    ToolResult,
    audit_refusal,
)
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.policy import ToolScope

# Tools that reach the parent's memory (seed: subagents cannot access it).
PARENT_MEMORY_PREFIX = "memory_"


def subagent_may_use(tool: Tool) -> bool:
    """Whether a subagent is offered ``tool`` at all (trust and policy aside)."""
    return not (
        tool.fanout or tool.delivers is not None or tool.name.startswith(PARENT_MEMORY_PREFIX)
    )


def nested_call_error(name: str) -> str:
    """The result of a fan-out tool called from within a subagent (or a skill run)."""
    if name == NAME:
        return NESTED_CALL_ERROR
    return f"Error: {name} cannot be called from within a subagent or a skill run"


class SubagentTools(ToolRegistry):
    """A subagent's registry. Fan-out tools are not offered; calling one anyway is an error
    result, never an exception.

    ``parent_tools`` and ``parent_policies`` are the parent turn's tool list and policy
    classes (``None``: no limit beyond trust; a job always carries the parent's). The
    subagent scope is built from them. ``allowed_tools`` (``None``: every permitted tool) and
    ``policies`` (``None``: no further limit) are a per-call list's, a skill's or a ``sub``
    agent's own limits, applied on top: they can only take tools away.

    ``needs_approval``: tools whose calls would wait for a person (``[approvals]``) where this
    run cannot park for one (a run without a claim, a skill run inside a subagent): they are
    not offered, and a call to one is refused. A subagent that can park is offered them (its
    loop asks). ``skill_run``: the subagent's inline ``skill_run`` (None: refused, as inside a
    skill run)."""

    def __init__(self, tools: Iterable[Tool], trust: Trust, *,
                 parent_tools: Iterable[str] | None = None,
                 parent_policies: Iterable[PolicyClass] | None = None,
                 allowed_tools: Iterable[str] | None = None,
                 policies: Iterable[PolicyClass] | None = None,
                 timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
                 needs_approval: Callable[[Tool], bool] = lambda tool: False,
                 skill_run: Tool | None = None):
        tools = list(tools)
        if skill_run is not None:
            tools = [t for t in tools if t.name != skill_tool.NAME] + [skill_run]
        self._fanout = frozenset(t.name for t in tools if t.fanout) | {NAME} | (
            {skill_tool.NAME} if skill_run is None else set())
        self._gated = {t.name: t for t in tools if needs_approval(t)}
        tools = [t for t in tools if t.name not in self._gated]
        parent = ToolScope(trust, None if parent_tools is None else tuple(parent_tools),
                           None if parent_policies is None else frozenset(parent_policies))
        scopes = [parent.for_subagent(None if allowed_tools is None else tuple(allowed_tools))]
        if policies is not None:
            scopes.append(ToolScope(trust, policies=frozenset(policies)))
        super().__init__([t for t in tools if subagent_may_use(t)], tuple(scopes),
                         timeout_s=timeout_s)

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult:
        if call.name in self._fanout:
            audit_refusal(ctx, call, nested_call_error(call.name), "subagent")
            return ToolResult(nested_call_error(call.name), is_error=True)
        if (gated := self._gated.get(call.name)) is not None:
            # Trust and policy refusals first: they say more than "nobody to ask".
            why = self._denial(gated) or SUBAGENT_REFUSAL.format(tool=call.name)
            audit_refusal(ctx, call, why, "subagent")
            return ToolResult(why, is_error=True)
        return super().execute(call, ctx)
