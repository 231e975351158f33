"""Anthropic Messages adapter."""

from __future__ import annotations

from typing import Any

import anthropic
from anthropic.lib.streaming import TextEvent

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ToolSpec
from fermix_worker.providers.errors import is_transport_error, translate

# Extended-thinking budgets (tokens) for a requested reasoning effort.
THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}


def to_wire(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Neutral messages to Anthropic's: tool results become user ``tool_result`` blocks, and
    consecutive results are merged into one user message as the API requires."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content,
                "is_error": m.is_error,
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list) and all(
                b.get("type") == "tool_result" for b in out[-1]["content"]
            ):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.role == "assistant" and m.tool_calls:
            # Thinking blocks first, verbatim: the API requires them before tool results.
            blocks: list[dict[str, Any]] = [dict(b) for b in m.reasoning]
            blocks += [{"type": "text", "text": m.content}] if m.content else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in m.tool_calls
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def tools_to_wire(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


class AnthropicProvider:
    """Streams one Messages call; ``timeout`` overrides the client's for this route."""

    name = "anthropic"

    def __init__(self, client: anthropic.Anthropic, *, timeout: anthropic.Timeout | None = None):
        self._client = client
        self._timeout = timeout

    def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "system": request.system,
            "messages": to_wire(request.messages),
            "max_tokens": request.max_tokens,
        }
        if request.tools:
            kwargs["tools"] = tools_to_wire(request.tools)
        if budget := THINKING_BUDGETS.get(request.reasoning_effort or ""):
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": budget}
            kwargs["max_tokens"] = max(request.max_tokens, budget + 1024)
        # request.temperature is not sent: the Messages API (SDK 2.x) has no sampling
        # temperature any more. An agent's temperature applies to OpenAI-compatible routes.
        if self._timeout is not None:
            kwargs["timeout"] = self._timeout
        # Whether the stream had begun (first SSE event, e.g. message_start) when a failure
        # hit: the router only re-issues a timed-out continuation when nothing had arrived.
        received = False
        try:
            with self._client.messages.stream(**kwargs) as stream:
                for event in stream:
                    received = True
                    if isinstance(event, TextEvent) and event.text:
                        on_delta(event.text)
                final = stream.get_final_message()
        except Exception as e:
            if not (isinstance(e, anthropic.AnthropicError) or is_transport_error(e)):
                raise
            raise translate(e, self.name, anthropic, received=received) from e
        text = "".join(b.text for b in final.content if b.type == "text")
        thinking = [b for b in final.content if b.type in ("thinking", "redacted_thinking")]
        calls = [
            ToolCall(id=b.id, name=b.name, arguments=dict(b.input) if isinstance(b.input, dict) else {})
            for b in final.content
            if b.type == "tool_use"
        ]
        return ModelTurn(
            text, calls, final.usage.input_tokens, final.usage.output_tokens, final.model,
            thinking="\n".join(getattr(b, "thinking", "") for b in thinking).strip(),
            reasoning=[b.model_dump(exclude_none=True) for b in thinking],
        )
