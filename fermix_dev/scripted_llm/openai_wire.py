"""OpenAI Chat Completions wire format (``POST /v1/chat/completions``) for scripted entries."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from .script import Fail, Reply, RequestView, estimate_usage, split_json, split_text

PROVIDER = "openai"


def _text_of(content: Any) -> str:
    """Text of a message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def parse_request(body: dict[str, Any]) -> RequestView:
    """Extract the last user text, trailing tool results and offered tool names."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    view = RequestView(model=str(body.get("model") or "scripted-model"))
    for msg in reversed(messages):
        if msg.get("role") == "user":
            view.last_user_text = _text_of(msg.get("content"))
            break
    call_names: dict[str, str] = {}
    for msg in messages:
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            call_names[str(call.get("id"))] = str(fn.get("name", ""))
    trailing: list[tuple[str | None, str]] = []
    for msg in reversed(messages):
        if msg.get("role") != "tool":
            break
        name = msg.get("name") or call_names.get(str(msg.get("tool_call_id"))) or None
        trailing.append((name, _text_of(msg.get("content"))))
    view.tool_results = trailing[::-1]
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            view.tool_names.append(str(fn["name"]))
    return view


def _calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": tc.id or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)},
        }
        for tc in reply.tool_calls
    ]


def _usage(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    """Usage as Chat Completions reports it: ``prompt_tokens`` includes the cached tokens,
    ``completion_tokens`` the reasoning ones (``cache_write_tokens`` only when there are some,
    as OpenAI-compatible servers that bill writes send it)."""
    u = estimate_usage(reply, body.get("messages"))
    prompt: dict[str, int] = {"cached_tokens": u.cache_read, "audio_tokens": 0}
    if u.cache_write:
        prompt["cache_write_tokens"] = u.cache_write
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": prompt,
        "completion_tokens_details": {"reasoning_tokens": u.reasoning, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }


def _envelope(obj: str, view: RequestView) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": obj,
        "created": int(time.time()),
        "model": view.model,
        "system_fingerprint": "fp_scripted",
    }


def render_response(reply: Reply, body: dict[str, Any], view: RequestView) -> dict[str, Any]:
    """Non-streaming ``chat.completion`` object."""
    calls = _calls(reply)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text if (reply.text or not calls) else None,
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "tool_calls" if calls else "stop",
    }
    return {**_envelope("chat.completion", view), "choices": [choice], "usage": _usage(reply, body)}


def stream_events(reply: Reply, body: dict[str, Any], view: RequestView) -> list[str]:
    """``chat.completion.chunk`` SSE events, ending with ``data: [DONE]``.

    Text is streamed word by word; each tool call as a header delta (``id``, ``type``,
    ``function.name``) followed by argument fragments, all with the call's ``index``.
    A usage-only chunk (``choices: []``) is added when ``stream_options.include_usage``.
    """
    base = _envelope("chat.completion.chunk", view)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        data = {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            data["usage"] = None
        return sse(data)

    calls = _calls(reply)
    first_content = "" if (reply.text or not calls) else None
    events = [chunk({"role": "assistant", "content": first_content, "refusal": None})]
    events += [chunk({"content": None, "reasoning_content": piece}) for piece in split_text(reply.thinking)]
    events += [chunk({"content": piece}) for piece in split_text(reply.text)]
    for index, call in enumerate(calls):
        head = {
            **call,
            "index": index,
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        for part in split_json(call["function"]["arguments"]):
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            )
    events.append(chunk({}, "tool_calls" if calls else "stop"))
    if include_usage:
        events.append(sse({**base, "choices": [], "usage": _usage(reply, body)}))
    events.append("data: [DONE]\n\n")
    return events


def sse(data: dict[str, Any]) -> str:
    """One ``data:``-only SSE event."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    503: ("server_error", "service_unavailable"),
}


def _duration(seconds: float) -> str:
    """OpenAI-style reset duration: ``20ms``, ``7s``, ``1m30s``."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m{secs:g}s" if minutes else f"{secs:g}s"


def error_response(fail: Fail) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, body, headers)`` for a scripted failure, shaped like OpenAI's errors."""
    default = ("invalid_request_error", None) if fail.status < 500 else ("server_error", None)
    err_type, code = _ERROR_KINDS.get(fail.status, default)
    body = {"error": {"message": fail.message, "type": err_type, "param": None, "code": code}}
    headers = {"x-request-id": f"req_{uuid.uuid4().hex[:24]}"}
    if fail.retry_after is not None:
        headers["retry-after"] = f"{fail.retry_after:g}"
        headers["retry-after-ms"] = str(int(fail.retry_after * 1000))
        if fail.status == 429:
            headers["x-ratelimit-remaining-requests"] = "0"
            headers["x-ratelimit-reset-requests"] = _duration(fail.retry_after)
            headers["x-ratelimit-reset-tokens"] = _duration(fail.retry_after)
    return fail.status, body, headers
