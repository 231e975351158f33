"""The ``skill_run`` tool as the model sees it, and the parse of its arguments.

Like ``subagents`` it is a fan-out tool: the loop parks the turn instead of calling ``run``,
and the fan-out (:mod:`fermix_worker.subagents.skill_run`) resolves the skill and runs it as
one bounded worker agent. Invalid arguments come back to the model as an error tool result.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from fermix_worker.subagents.tool import ArgsError
from fermix_worker.tools.base import Tool
from fermix_worker.tools.context import RunContext

NAME = "skill_run"

DESCRIPTION = (
    "Run a skill (see skill_list) as a temporary worker agent that follows the skill's "
    "instructions on your task and reports back. Give the task self-contained: the worker sees "
    "nothing else of this conversation and cannot reach the user. It runs with the skill's "
    "tools, never more than you may use, within a time limit; its answer is this call's result."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "The skill's name, as skill_list shows it."},
        "task": {
            "type": "string",
            "description": "What the skill should do: the input and the result you want.",
        },
    },
    "required": ["name", "task"],
    "additionalProperties": False,
}


class SkillRunArgs(BaseModel):
    """The validated arguments of one ``skill_run`` call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    task: str

    @field_validator("name", "task")
    @classmethod
    def _non_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()


def parse_skill_args(arguments: dict[str, Any]) -> SkillRunArgs:
    """Validate a call's arguments. Raises :class:`ArgsError` (its text is the result)."""
    if "_unparsed" in arguments:
        raise ArgsError("Error: tool arguments were not valid JSON")
    try:
        return SkillRunArgs.model_validate(arguments)
    except ValidationError as e:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in e.errors()
        )
        raise ArgsError(f"Error: invalid skill_run arguments: {detail}") from None


def _never_called(ctx: RunContext, arguments: dict[str, Any]) -> str:
    raise AssertionError("the skill_run tool parks the turn; its run is never called")


# Policy ``read_only``, unlike ``subagents`` (``exec``): a guest may run the skills it can
# already list and view (plugin skills), because the run is bounded by the lower of the
# skill's and the caller's trust, so a guest's skill run uses read_only tools only, one
# bounded agent per call, inside the guest turn's own deadline: it can do nothing the guest's
# own turn could not. Operators' skills stay invisible to guests, so guests cannot run them.
SKILL_RUN_TOOL = Tool(
    name=NAME,
    description=DESCRIPTION,
    parameters=PARAMETERS,
    run=_never_called,
    policy="read_only",
    idempotent=False,
    fanout=True,
)
