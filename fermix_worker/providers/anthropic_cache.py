"""Anthropic prompt caching: where a Messages request puts its ``cache_control`` breakpoints.

Anthropic caches a request's prefix (tools, then system, then messages) up to a block marked
``cache_control: {"type": "ephemeral"}``; a later request whose prefix matches up to a marked
block of its own (or one of the ~20 block boundaries before it) reads it at a tenth of the input
price, and pays 1.25 times for the part it writes. At most four breakpoints a request. Chosen,
in this order, until four:

1. the newest message (the user's message or the latest tool results), when the call offers
   tools: the next step of the tool loop reads everything up to it and pays only for what the
   step added (a call without tools is a one-off: compaction, memory review; marking its
   newest message would only pay the write surcharge);
2. the end of the history (the last assistant message before a user message that is not tool
   results): the next turn of the conversation reads up to there;
3. the system prompt, which caches the tool definitions before it too, for every conversation
   of the agent;
4. the end of the history before the previous turn: what the previous turn wrote at its (2),
   which this turn reads even when more than 20 blocks lie between;
5. the last tool definition (when a slot is left: a conversation's first turns).

The marks are put on copies: the adapter's transcript (``provider_state``) stays unmarked, so
breakpoints never pile up as a tool loop grows.
"""

from __future__ import annotations

from typing import Any

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
# Blocks that cannot carry cache_control themselves.
_UNMARKABLE = {"thinking", "redacted_thinking"}


def with_breakpoints(system: str, tools: list[dict[str, Any]], messages: list[dict[str, Any]]
                     ) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]],
                                list[dict[str, Any]]]:
    """``(system, tools, messages)`` as sent with breakpoints (module docstring); the
    arguments are not modified."""
    wanted: list[tuple[str, int]] = []
    boundaries = turn_boundaries(messages)
    if tools and messages:
        wanted.append(("message", len(messages) - 1))
    if boundaries:
        wanted.append(("message", boundaries[-1]))
    if system:
        wanted.append(("system", 0))
    if len(boundaries) > 1:
        wanted.append(("message", boundaries[-2]))
    if tools:
        wanted.append(("tool", len(tools) - 1))
    out_messages, out_tools = list(messages), list(tools)
    out_system: str | list[dict[str, Any]] = system
    placed: set[tuple[str, int]] = set()
    for where, i in wanted:
        if len(placed) == MAX_BREAKPOINTS or (where, i) in placed:
            continue
        if where == "system":
            out_system = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        elif where == "tool":
            out_tools[i] = {**tools[i], "cache_control": EPHEMERAL}
        elif (marked := _marked(messages[i])) is not None:
            out_messages[i] = marked
        else:
            continue
        placed.add((where, i))
    return out_system, out_tools, out_messages


def turn_boundaries(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages that end a turn: each followed by a user message
    that is not (only) tool results, i.e. the next turn's first message."""
    return [i for i, (m, nxt) in enumerate(zip(messages, messages[1:], strict=False))
            if m.get("role") == "assistant" and nxt.get("role") == "user"
            and not _has_tool_results(nxt)]


def _has_tool_results(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _marked(message: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``message`` with its last markable block marked; None when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        return {**message, "content": [{"type": "text", "text": content,
                                        "cache_control": EPHEMERAL}]}
    if not isinstance(content, list):
        return None
    for j in range(len(content) - 1, -1, -1):
        block = content[j]
        if isinstance(block, dict) and block.get("type") not in _UNMARKABLE and (
                block.get("type") != "text" or block.get("text")):
            blocks = list(content)
            blocks[j] = {**block, "cache_control": EPHEMERAL}
            return {**message, "content": blocks}
    return None
