"""Anthropic Messages wire format (``POST /v1/messages``) for scripted entries."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from .script import Fail, Reply, RequestView, Usage, estimate_usage, split_json, split_text

PROVIDER = "anthropic"


def _text_of(content: Any) -> str:
    """Text of ``content``: a string or the concatenated ``text`` blocks of a block list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def parse_request(body: dict[str, Any]) -> RequestView:
    """Extract the last user text, trailing tool results and offered tool names.

    The "last user text" is that of the last user message holding text; user messages that
    carry only ``tool_result`` blocks are skipped, matching OpenAI where tool results are
    separate ``tool`` messages.
    """
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    view = RequestView(model=str(body.get("model") or "scripted-model"))
    for msg in reversed(messages):
        if msg.get("role") == "user" and (text := _text_of(msg.get("content"))):
            view.last_user_text = text
            break
    names: dict[str, str] = {}
    for msg in messages:
        content = msg.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                names[str(block.get("id"))] = str(block.get("name", ""))
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and isinstance(last.get("content"), list):
        for block in last["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                name = names.get(str(block.get("tool_use_id"))) or None
                view.tool_results.append((name, _text_of(block.get("content"))))
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("name"):
            view.tool_names.append(str(tool["name"]))
    return view


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.thinking:
        blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": "scripted-sig"})
    if reply.text or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.text})
    for tc in reply.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": tc.id or f"toolu_{uuid.uuid4().hex[:24]}",
                "name": tc.name,
                "input": tc.arguments,
            }
        )
    return blocks


def _usage(u: Usage, output_tokens: int) -> dict[str, Any]:
    """Usage as the Messages API reports it: ``input_tokens`` without the cache's reads and
    writes (reported apart), ``output_tokens`` with the thinking tokens."""
    usage: dict[str, Any] = {
        "input_tokens": u.uncached_input, "output_tokens": output_tokens,
        "cache_read_input_tokens": u.cache_read, "cache_creation_input_tokens": u.cache_write,
    }
    if u.cache_write:
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": u.cache_write,
                                   "ephemeral_1h_input_tokens": 0}
    if u.reasoning:
        usage["output_tokens_details"] = {"thinking_tokens": u.reasoning}
    return usage


def _message(view: RequestView, content: list[Any], usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": view.model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


def _stop_reason(reply: Reply) -> str:
    return "tool_use" if reply.tool_calls else "end_turn"


def render_response(reply: Reply, body: dict[str, Any], view: RequestView) -> dict[str, Any]:
    """Non-streaming ``message`` object."""
    u = estimate_usage(reply, body.get("messages"))
    msg = _message(view, _blocks(reply), _usage(u, u.output_tokens))
    msg["stop_reason"] = _stop_reason(reply)
    return msg


def stream_events(reply: Reply, body: dict[str, Any], view: RequestView) -> list[str]:
    """Named SSE events: ``message_start``, ``ping``, per block ``content_block_start`` /
    ``content_block_delta`` (``text_delta`` or ``input_json_delta``) / ``content_block_stop``,
    then ``message_delta`` (stop_reason, usage) and ``message_stop``.
    """
    u = estimate_usage(reply, body.get("messages"))
    events = [
        sse("message_start", {"message": _message(view, [], _usage(u, 1))}),
        sse("ping", {}),
    ]
    for index, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": t} for t in split_text(block["text"])]
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": t} for t in split_text(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            start = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in split_json(raw)]
        events.append(sse("content_block_start", {"index": index, "content_block": start}))
        events += [sse("content_block_delta", {"index": index, "delta": d}) for d in deltas]
        events.append(sse("content_block_stop", {"index": index}))
    delta = {"stop_reason": _stop_reason(reply), "stop_sequence": None}
    events.append(sse("message_delta", {"delta": delta, "usage": _usage(u, u.output_tokens)}))
    events.append(sse("message_stop", {}))
    return events


def sse(event: str, data: dict[str, Any]) -> str:
    """One named SSE event; ``data`` also carries ``"type": event`` as the real API does."""
    payload = json.dumps({"type": event, **data}, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n"


_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_response(fail: Fail) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, body, headers)`` for a scripted failure, shaped like Anthropic's errors."""
    default = "invalid_request_error" if fail.status < 500 else "api_error"
    request_id = f"req_{uuid.uuid4().hex[:24]}"
    body = {
        "type": "error",
        "error": {"type": _ERROR_TYPES.get(fail.status, default), "message": fail.message},
        "request_id": request_id,
    }
    headers = {"request-id": request_id}
    if fail.retry_after is not None:
        headers["retry-after"] = f"{fail.retry_after:g}"
        headers["retry-after-ms"] = str(int(fail.retry_after * 1000))
        if fail.status == 429:
            reset = datetime.now(UTC) + timedelta(seconds=fail.retry_after)
            stamp = reset.isoformat(timespec="seconds").replace("+00:00", "Z")
            for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
                headers[f"anthropic-ratelimit-{kind}-reset"] = stamp
            headers["anthropic-ratelimit-requests-remaining"] = "0"
    return fail.status, body, headers
