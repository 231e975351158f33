"""OpenAI Chat Completions adapter (also OpenAI-compatible servers via ``OPENAI_BASE_URL``)."""

from __future__ import annotations

import json
from typing import Any

import openai

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ToolSpec
from fermix_worker.providers.errors import is_transport_error, translate


def to_wire(system: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append({
                "role": "assistant",
                "content": m.content or None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in m.tool_calls
                ],
            })
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def tools_to_wire(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _parse_arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return {"_unparsed": raw}
    return value if isinstance(value, dict) else {"_value": value}


class OpenAIProvider:
    """Streams one Chat Completions call; ``timeout`` overrides the client's for this route."""

    name = "openai"

    def __init__(self, client: openai.OpenAI, *, timeout: openai.Timeout | None = None):
        self._client = client
        self._timeout = timeout

    def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": to_wire(request.system, request.messages),
            "max_completion_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            kwargs["tools"] = tools_to_wire(request.tools)
        if request.reasoning_effort:
            kwargs["reasoning_effort"] = request.reasoning_effort
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if self._timeout is not None:
            kwargs["timeout"] = self._timeout
        # Whether the stream had begun (first SSE chunk) when a failure hit: the router only
        # re-issues a timed-out continuation when nothing at all had arrived.
        received = False
        text: list[str] = []
        thinking: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        usage_in = usage_out = 0
        model = request.model
        try:
            with self._client.chat.completions.create(**kwargs) as stream:
                for chunk in stream:
                    received = True
                    model = chunk.model or model
                    if chunk.usage:
                        usage_in = chunk.usage.prompt_tokens
                        usage_out = chunk.usage.completion_tokens
                    for choice in chunk.choices:
                        delta = choice.delta
                        if delta.content:
                            text.append(delta.content)
                            on_delta(delta.content)
                        # OpenAI-compatible reasoning servers (vLLM, DeepSeek) stream it here.
                        if reasoning := getattr(delta, "reasoning_content", None):
                            thinking.append(str(reasoning))
                        for tc in delta.tool_calls or []:
                            slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                            if tc.id:
                                slot["id"] = tc.id
                            if tc.function and tc.function.name:
                                slot["name"] += tc.function.name
                            if tc.function and tc.function.arguments:
                                slot["args"] += tc.function.arguments
        except Exception as e:
            if not (isinstance(e, openai.OpenAIError) or is_transport_error(e)):
                raise
            raise translate(e, self.name, openai, received=received) from e
        tool_calls = [
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=_parse_arguments(c["args"]))
            for i, c in sorted(calls.items())
        ]
        return ModelTurn("".join(text), tool_calls, usage_in, usage_out, model,
                         thinking="".join(thinking).strip())
