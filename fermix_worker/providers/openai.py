"""OpenAI Chat Completions adapter (also OpenAI-compatible servers via ``OPENAI_BASE_URL``)."""

from __future__ import annotations

import json
from typing import Any

import openai

from fermix_shared.messages import ChatMessage, ToolCall
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


def to_wire(system: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, *messages_to_wire(messages)]


def messages_to_wire(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Neutral messages as Chat Completions messages (the loop guard's notice as a system
    message, where the API has the role)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append(_assistant(m.content, m.tool_calls))
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _assistant(content: str, calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls
        ]
    return message


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

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """From the neutral transcript (a turn's first call, or one whose state is gone)."""
        return self._call(request, to_wire(request.system, request.messages), on_delta)

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """From this adapter's own transcript plus ``tool_results``."""
        wire = own_state(provider_state, self.name)
        if wire is None:
            return self.chat(opts, on_delta)
        return self._call(opts, [*wire, *messages_to_wire(tool_results)], on_delta)

    def _call(self, request: ModelRequest, wire: list[dict[str, Any]], on_delta: OnDelta
              ) -> ModelTurn:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": wire,
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
        got = _Streamed(request.model)
        try:
            with self._client.chat.completions.create(**kwargs) as stream:
                for chunk in stream:
                    got.add(chunk, on_delta)
        except Exception as e:
            if not (isinstance(e, openai.OpenAIError) or is_transport_error(e)):
                raise
            raise translate(e, self.name, openai, received=got.received) from e
        calls = sorted(got.calls.items())
        tool_calls = unique_ids([
            ToolCall(id=c["id"], name=c["name"], arguments=_parse_arguments(c["args"]))
            for _, c in calls
        ])
        content = "".join(got.text)
        said = _assistant(content, tool_calls)
        for sent, (_, raw) in zip(said.get("tool_calls", []), calls, strict=True):
            sent["function"]["arguments"] = raw["args"]  # as the model wrote them
        state = {"provider": self.name, "messages": [*wire, said]}
        return ModelTurn(content, tool_calls, got.usage_in, got.usage_out, got.model,
                         thinking="".join(got.thinking).strip(), provider_state=state,
                         cache_read_tokens=got.cache_read, cache_write_tokens=got.cache_write,
                         reasoning_tokens=got.reasoning, finish_reason=got.finish_reason)


class _Streamed:
    """What a Chat Completions stream carried so far."""

    def __init__(self, model: str) -> None:
        # Whether the stream had begun (first SSE chunk) when a failure hit: the router only
        # re-issues a timed-out continuation when nothing at all had arrived.
        self.received = False
        self.model = model
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.usage_in = self.usage_out = 0
        self.cache_read = self.cache_write = self.reasoning = 0
        self.finish_reason = ""

    def add(self, chunk: Any, on_delta: OnDelta) -> None:
        self.received = True
        self.model = chunk.model or self.model
        if chunk.usage:
            self._usage(chunk.usage)
        for choice in chunk.choices:
            self.finish_reason = choice.finish_reason or self.finish_reason
            delta = choice.delta
            if delta.content:
                self.text.append(delta.content)
                on_delta(delta.content)
            # OpenAI-compatible reasoning servers (vLLM, DeepSeek) stream it here.
            if reasoning := getattr(delta, "reasoning_content", None):
                self.thinking.append(str(reasoning))
            for tc in delta.tool_calls or []:
                slot = self.calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["args"] += tc.function.arguments

    def _usage(self, usage: Any) -> None:
        """The usage chunk: ``prompt_tokens`` includes the cached (and, on servers that
        report them, cache-written) tokens, ``completion_tokens`` the reasoning ones."""
        self.usage_in = usage.prompt_tokens
        self.usage_out = usage.completion_tokens
        prompt, completion = usage.prompt_tokens_details, usage.completion_tokens_details
        self.cache_read = (prompt.cached_tokens or 0) if prompt else 0
        self.cache_write = (getattr(prompt, "cache_write_tokens", None) or 0) if prompt else 0
        self.reasoning = (completion.reasoning_tokens or 0) if completion else 0
