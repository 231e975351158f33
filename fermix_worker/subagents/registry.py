"""The tools a subagent may use: the parent's, at the parent's trust, minus what a subagent
must never do.

Policy classes: the parent's minus ``read_write`` and ``gui_control``
(:meth:`ToolScope.for_subagent`). Beyond policy, a subagent gets no fan-out tool (no
recursion: a call to ``subagents`` gets the seed's error as its result), no tool whose success
is a reply on the parent's channel (reactions, attachments), and none of the parent's memory
tools.
"""

from __future__ import annotations

from collections.abc import Iterable

from fermix_shared.messages import ToolCall
from fermix_shared.models import Trust
from fermix_worker.subagents.prompts import NESTED_CALL_ERROR
from fermix_worker.subagents.tool import NAME
from fermix_worker.tools.base import DEFAULT_TOOL_TIMEOUT_S, Tool, ToolRegistry, ToolResult
from fermix_worker.tools.policy import ToolScope

# Tools that reach the parent's memory (seed: subagents cannot access it).
PARENT_MEMORY_PREFIX = "memory_"


def subagent_may_use(tool: Tool) -> bool:
    """Whether a subagent is offered ``tool`` at all (trust and policy aside)."""
    return not (
        tool.fanout or tool.delivers is not None or tool.name.startswith(PARENT_MEMORY_PREFIX)
    )


class SubagentTools(ToolRegistry):
    """A subagent's registry. ``subagents`` is not offered; calling it anyway is an error
    result, never an exception."""

    def __init__(self, tools: Iterable[Tool], trust: Trust, *,
                 timeout_s: float = DEFAULT_TOOL_TIMEOUT_S):
        super().__init__(
            [t for t in tools if subagent_may_use(t)], (ToolScope(trust).for_subagent(),),
            timeout_s=timeout_s,
        )

    def execute(self, call: ToolCall) -> ToolResult:
        if call.name == NAME:
            return ToolResult(NESTED_CALL_ERROR, is_error=True)
        return super().execute(call)
