"""Provider-neutral conversation messages: what history stores and what the loop works on.

Adapters translate these to and from each provider's wire format; nothing else knows one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    """One message. ``tool`` messages answer the ``tool_calls`` of the assistant message before.

    ``system`` messages are notices the runtime injects into a turn (the loop guard's); they are
    sent to the model and never committed to history.
    """

    role: Literal["user", "assistant", "tool", "system"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
