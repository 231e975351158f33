"""Tools: what the model may call, with a policy class, and a registry that never raises.

A failing, unknown or malformed call becomes an error *result* for the model to read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fermix_shared.messages import ToolCall
from fermix_worker.providers.base import ToolSpec

PolicyClass = Literal["read_only", "read_write", "exec", "network", "external_api", "gui_control"]

# Tool results longer than this are cut before they go back to the model.
MAX_RESULT_CHARS = 20_000


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any]], str]
    policy: PolicyClass = "read_only"
    # Safe to run again if a worker died while it ran (durable turns re-run only these).
    idempotent: bool = True
    # Set for tools whose success is itself a reply to the user (an emoji reaction, an
    # attachment): a turn that did this and then produced no text closes silently.
    delivers: Literal["reaction", "attachment"] | None = None

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


@dataclass(frozen=True)
class ToolResult:
    content: str
    is_error: bool = False


class ToolError(Exception):
    """Raised by a tool for a failure whose message the model should see as-is."""


class ToolRegistry:
    def __init__(self, tools: list[Tool]):
        self._tools = {t.name: t for t in tools}

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self._tools.values()]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def execute(self, call: ToolCall) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult(f"Error: unknown tool {call.name!r}", is_error=True)
        if "_unparsed" in call.arguments:
            return ToolResult("Error: tool arguments were not valid JSON", is_error=True)
        try:
            out = tool.run(call.arguments)
        except ToolError as e:
            return ToolResult(f"Error: {e}", is_error=True)
        except Exception as e:  # a broken tool must not break the turn
            return ToolResult(f"Error: {call.name} failed: {type(e).__name__}: {e}", is_error=True)
        if not isinstance(out, str):
            out = json.dumps(out)
        if len(out) > MAX_RESULT_CHARS:
            out = out[:MAX_RESULT_CHARS] + "\n[truncated]"
        return ToolResult(out)
