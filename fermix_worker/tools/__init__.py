"""Tool registry, the run context a tool gets, policy scopes, the external-content fence and
the built-in tools."""

from fermix_shared.models import Trust
from fermix_worker.tools.base import PolicyClass, Tool, ToolError, ToolRegistry, ToolResult
from fermix_worker.tools.builtin import BUILTIN_TOOLS as _CORE_TOOLS
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.fence import fence
from fermix_worker.tools.policy import GUEST, OPERATOR, ToolScope
from fermix_worker.tools.web import HTTP_FETCH

# Every tool Fermix ships; a caller sees the subset its ToolScope permits.
BUILTIN_TOOLS: list[Tool] = [*_CORE_TOOLS, HTTP_FETCH]

__all__ = [
    "BUILTIN_TOOLS",
    "GUEST",
    "HTTP_FETCH",
    "OPERATOR",
    "PolicyClass",
    "RunContext",
    "Tool",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "ToolScope",
    "Trust",
    "fence",
]
