"""The memory tools: ``memory_store``, ``memory_recall`` and ``memory_forget``.

Storing and forgetting change the agent's memory (``read_write``: operators only);
recalling reads it (``read_only``). Recalled facts came from conversations, so they go back to
the model inside the ``<untrusted_tool_result>`` fence, as data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fermix_shared.memory import MAX_FORGET_AT_ONCE, Fact, MemoryRefused, MemoryStore
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.fence import fence

DEFAULT_RECALL_LIMIT = 10
MAX_RECALL_LIMIT = 50
TOOL_SOURCE = "tool"


def _line(fact: Fact) -> str:
    return f"[{fact.id}] {fact.text}"


def _text(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    return value.strip() if isinstance(value, str) else ""


def memory_tools(store_factory: Callable[[], MemoryStore]) -> list[Tool]:
    """The three memory tools over the store ``store_factory`` returns (called per call, so
    no Redis client is made before a tool runs)."""

    def store(args: dict[str, Any]) -> str:
        try:
            fact, new = store_factory().add_fact(_text(args, "text"), TOOL_SOURCE)
        except MemoryRefused as e:
            raise ToolError(str(e)) from e
        return f"Remembered {_line(fact)}" if new else f"Already remembered as {_line(fact)}"

    def recall(args: dict[str, Any]) -> str:
        limit = args.get("limit", DEFAULT_RECALL_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            limit = DEFAULT_RECALL_LIMIT
        facts = store_factory().recall(_text(args, "query"), min(limit, MAX_RECALL_LIMIT))
        body = "\n".join(_line(f) for f in facts) if facts else "No remembered facts match."
        return fence("memory_recall", body)

    def forget(args: dict[str, Any]) -> str:
        fact_id, query = _text(args, "id"), _text(args, "query")
        if not fact_id and not query:
            raise ToolError("give the id of a fact, or a query its text contains")
        try:
            gone = store_factory().forget(fact_id=fact_id or None, query=query or None)
        except MemoryRefused as e:
            raise ToolError(str(e)) from e
        if not gone:
            return "Nothing matched; nothing was forgotten."
        return "Forgot:\n" + "\n".join(_line(f) for f in gone)

    return [
        Tool(
            name="memory_store",
            description=(
                "Remember a durable fact for later conversations (a preference, a name, a "
                "decision). One short sentence; repeats are stored once."
            ),
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string", "description": "the fact"}},
                "required": ["text"],
            },
            run=store,
            policy="read_write",
        ),
        Tool(
            name="memory_recall",
            description=(
                "Search remembered facts. Returns the best matches with their ids; an empty "
                "query lists the most recent."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RECALL_LIMIT},
                },
                "required": ["query"],
            },
            run=recall,
            # The operator's facts are not a guest's to read.
            operator_only=True,
        ),
        Tool(
            name="memory_forget",
            description=(
                "Delete remembered facts for good: by id, or every fact containing a query "
                f"(at most {MAX_FORGET_AT_ONCE} at once)."
            ),
            parameters={
                "type": "object",
                "properties": {"id": {"type": "string"}, "query": {"type": "string"}},
            },
            run=forget,
            policy="read_write",
        ),
    ]
