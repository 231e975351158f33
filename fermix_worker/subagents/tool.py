"""The ``subagents`` tool as the model sees it, and the parse of its arguments.

The tool is a fan-out tool: the loop parks the turn instead of calling ``run``, and the fan-out
(:mod:`fermix_worker.subagents.fanout`) validates the arguments against the caps of the turn's
profile. Invalid arguments come back to the model as an error tool result, never an exception.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fermix_shared.errors import UserInputError
from fermix_shared.models import RunProfile
from fermix_worker.subagents.caps import REGULAR, ULTRA, SubagentCaps, caps_for
from fermix_worker.subagents.prompts import DEFAULT_RESULT_FORMAT, ResultFormat
from fermix_worker.tools.base import Tool, ToolRegistry
from fermix_worker.tools.context import RunContext

NAME = "subagents"
ReasoningEffort = Literal["minimal", "low", "medium", "high"]

def description(caps: SubagentCaps) -> str:
    """What the model reads about the tool: the caps of the turn's profile (the seed: "the
    subagents tool advertises wider caps" under /ultra)."""
    mode = " (this turn is in /ultra mode)" if caps is ULTRA else " (more in /ultra mode)"
    return (
        "Fan work out to temporary subagents that run concurrently and report back. Give each "
        "task as a self-contained, goal-level description (the subagent sees nothing else of "
        f"this conversation). Up to {caps.max_tasks} tasks per call, {caps.concurrency} at a "
        f"time{mode}; each subagent has a time limit and can use the tools you may use, except "
        "those that write local state, reach the user or call subagents. Results come back "
        "together, in task order, with a status per task."
    )


DESCRIPTION = description(REGULAR)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "One self-contained task description per subagent.",
        },
        "result_format": {
            "type": "string",
            "enum": ["concise", "detailed", "structured"],
            "description": "How much each subagent reports (default structured).",
        },
        "model": {"type": "string", "description": "Model id for these subagents only."},
        "provider": {
            "type": "string",
            "enum": ["anthropic", "openai"],
            "description": "Provider for these subagents only (with model).",
        },
        "reasoning_effort": {
            "type": "string",
            "enum": ["minimal", "low", "medium", "high"],
            "description": "How much the subagents' model thinks before answering.",
        },
        "tools": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Only these tools for these subagents (default: every tool they "
                           "may use). It can only narrow: a tool you may not use stays out.",
        },
    },
    "required": ["tasks"],
    "additionalProperties": False,
}


class SubagentsArgs(BaseModel):
    """The validated arguments of one ``subagents`` call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[str] = Field(min_length=1)
    result_format: ResultFormat = DEFAULT_RESULT_FORMAT
    model: str | None = None
    provider: Literal["anthropic", "openai"] | None = None
    reasoning_effort: ReasoningEffort | None = None
    # Narrows the subagents' tools for this call (never widens: subagents/registry.py).
    tools: list[str] | None = None

    @field_validator("tasks")
    @classmethod
    def _non_blank(cls, tasks: list[str]) -> list[str]:
        out = [t.strip() for t in tasks]
        if any(not t for t in out):
            raise ValueError("every task must be a non-empty description")
        return out

    @field_validator("model")
    @classmethod
    def _model(cls, model: str | None) -> str | None:
        return (model or "").strip() or None


class ArgsError(UserInputError):
    """Arguments the fan-out refuses; ``str(e)`` is the error result the model reads."""


def parse_args(arguments: dict[str, Any], caps: SubagentCaps, ultra: bool) -> SubagentsArgs:
    """Validate a call's arguments against ``caps``. Raises :class:`ArgsError`."""
    if "_unparsed" in arguments:
        raise ArgsError("Error: tool arguments were not valid JSON")
    try:
        args = SubagentsArgs.model_validate(arguments)
    except ValidationError as e:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in e.errors()
        )
        raise ArgsError(f"Error: invalid subagents arguments: {detail}") from None
    if len(args.tasks) > caps.max_tasks:
        mode = " in /ultra mode" if ultra else ""
        raise ArgsError(
            f"Error: too many tasks: {len(args.tasks)} given, at most {caps.max_tasks} per "
            f"subagents call{mode}. Split the work or merge tasks."
        )
    return args


def task_count(arguments: dict[str, Any]) -> int:
    """How many tasks a call asks for (0 when it is malformed): sizes the fan-out's deadline."""
    tasks = arguments.get("tasks")
    return len(tasks) if isinstance(tasks, list) else 0


def _never_called(ctx: RunContext, arguments: dict[str, Any]) -> str:
    raise AssertionError("the subagents tool parks the turn; its run is never called")


def subagents_tool(caps: SubagentCaps) -> Tool:
    """The tool advertising ``caps`` (its description and the schema's ``maxItems``)."""
    tasks = {**PARAMETERS["properties"]["tasks"], "maxItems": caps.max_tasks}
    parameters = {**PARAMETERS, "properties": {**PARAMETERS["properties"], "tasks": tasks}}
    # Policy ``exec``: it makes the agent run more agents (and their tools) on the caller's
    # behalf. Guests (``read_only``) do not get it, as the seed keeps it from guest-created jobs.
    return Tool(name=NAME, description=description(caps), parameters=parameters,
                run=_never_called, policy="exec", idempotent=False, fanout=True)


SUBAGENTS_TOOL = subagents_tool(REGULAR)


def for_profile(tools: ToolRegistry, profile: RunProfile) -> ToolRegistry:
    """``tools`` as a turn run with ``profile`` is offered them: the subagents tool (where the
    view has it) advertising that profile's caps."""
    return tools.with_variant(subagents_tool(caps_for(profile)))
