"""Tool registry and built-in tools."""

from fermix_worker.tools.base import Tool, ToolError, ToolRegistry, ToolResult
from fermix_worker.tools.builtin import BUILTIN_TOOLS

__all__ = ["BUILTIN_TOOLS", "Tool", "ToolError", "ToolRegistry", "ToolResult"]
