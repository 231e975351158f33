"""Anthropic Messages adapter."""

from __future__ import annotations

from typing import Any

import anthropic
from anthropic.lib.streaming import TextEvent

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.providers.anthropic_cache import with_breakpoints
from fermix_worker.providers.base import (
    ModelRequest,
    ModelTurn,
    OnDelta,
    ProviderState,
    ToolSpec,
    own_state,
    unique_ids,
)
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
        elif m.role == "system":
            # No system role inside a conversation: the notice is a text block of the user turn
            # (after the tool results it follows, as the API allows).
            text = {"type": "text", "text": m.content}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(text)
            else:
                out.append({"role": "user", "content": [text]})
        elif m.role == "assistant" and m.tool_calls:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in m.tool_calls
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _mid_tool_loop(messages: list[ChatMessage]) -> bool:
    """Whether ``messages`` continue a tool loop (tool results after the last assistant turn):
    a call from them cannot enable thinking, having no thinking block to send back."""
    for m in reversed(messages):
        if m.role == "assistant":
            return bool(m.tool_calls)
    return False


def _block(b: Any) -> dict[str, Any] | None:
    """A response content block as the request takes it back, verbatim where it must be
    (thinking and its signature); None for an empty text block (the API refuses those)."""
    match b.type:
        case "text":
            return {"type": "text", "text": b.text} if b.text else None
        case "tool_use":
            return {"type": "tool_use", "id": b.id, "name": b.name,
                    "input": dict(b.input) if isinstance(b.input, dict) else {}}
        case "thinking":
            return {"type": "thinking", "thinking": b.thinking, "signature": b.signature}
        case "redacted_thinking":
            return {"type": "redacted_thinking", "data": b.data}
    return None


def tools_to_wire(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


class AnthropicProvider:
    """Streams one Messages call; ``timeout`` overrides the client's for this route."""

    name = "anthropic"

    def __init__(self, client: anthropic.Anthropic, *, timeout: anthropic.Timeout | None = None,
                 prompt_cache: bool = True):
        self._client = client
        self._timeout = timeout
        # cache_control breakpoints on each request (anthropic_cache.py); off: none.
        self._prompt_cache = prompt_cache

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """From the neutral transcript (a turn's first call, or one whose state is gone)."""
        thinking = not _mid_tool_loop(request.messages)
        return self._call(request, to_wire(request.messages), on_delta, thinking=thinking)

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """From this adapter's own transcript (thinking blocks and all) plus ``tool_results``."""
        wire = own_state(provider_state, self.name)
        if wire is None or provider_state is None:
            return self.chat(opts, on_delta)
        return self._call(opts, [*wire, *to_wire(tool_results)], on_delta,
                          thinking=bool(provider_state.get("thinking")))

    def _kwargs(self, request: ModelRequest, wire: list[dict[str, Any]], *, thinking: bool
                ) -> tuple[dict[str, Any], int | None]:
        """The Messages call's arguments, and its thinking budget (None: no thinking)."""
        kwargs: dict[str, Any] = {
            "model": request.model,
            "system": request.system,
            "messages": wire,
            "max_tokens": request.max_tokens,
        }
        if request.tools:
            kwargs["tools"] = tools_to_wire(request.tools)
        if self._prompt_cache:  # marked copies: ``wire``, the state, stays unmarked
            kwargs["system"], tools, kwargs["messages"] = with_breakpoints(
                request.system, kwargs.get("tools", []), wire)
            if tools:
                kwargs["tools"] = tools
        budget = THINKING_BUDGETS.get(request.reasoning_effort or "") if thinking else None
        if budget:
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": budget}
            kwargs["max_tokens"] = max(request.max_tokens, budget + 1024)
        # request.temperature is not sent: the Messages API (SDK 2.x) has no sampling
        # temperature any more. An agent's temperature applies to OpenAI-compatible routes.
        if self._timeout is not None:
            kwargs["timeout"] = self._timeout
        return kwargs, budget

    def _call(self, request: ModelRequest, wire: list[dict[str, Any]], on_delta: OnDelta, *,
              thinking: bool) -> ModelTurn:
        kwargs, budget = self._kwargs(request, wire, thinking=thinking)
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
        shown = [b for b in final.content if b.type == "thinking"]
        calls = unique_ids([
            ToolCall(id=b.id, name=b.name, arguments=dict(b.input) if isinstance(b.input, dict) else {})
            for b in final.content
            if b.type == "tool_use"
        ])
        ids = iter(c.id for c in calls)
        blocks = [b for b in map(_block, final.content) if b is not None]
        for block in blocks:  # the ids the loop's tool results will answer
            if block["type"] == "tool_use":
                block["id"] = next(ids)
        state = {"provider": self.name, "thinking": bool(budget),
                 "messages": [*wire, {"role": "assistant", "content": blocks}]}
        u = final.usage
        # The API counts cache reads and writes apart from input_tokens: ours include them.
        cached, written = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        return ModelTurn(
            text, calls, u.input_tokens + cached + written, u.output_tokens, final.model,
            thinking="\n".join(b.thinking for b in shown).strip(), provider_state=state,
            cache_read_tokens=cached, cache_write_tokens=written,
            reasoning_tokens=u.output_tokens_details.thinking_tokens
            if u.output_tokens_details else 0,
            finish_reason=final.stop_reason or "",
        )
