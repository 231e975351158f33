"""The memory tools: ``memory_store``, ``memory_recall`` and ``memory_forget``.

Storing and forgetting change the agent's memory (``read_write``: operators only);
recalling reads it (``read_only``). Recalled facts came from conversations, so they go back to
the model inside the ``<untrusted_tool_result>`` fence, as data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fermix_shared import audit
from fermix_shared.memory import MAX_FORGET_AT_ONCE, Fact, MemoryRefused, MemoryStore
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.fence import fence

DEFAULT_RECALL_LIMIT = 10
MAX_RECALL_LIMIT = 50
TOOL_SOURCE = "tool"


def _line(fact: Fact) -> str:
    return f"[{fact.id}] {fact.text}"


def _text(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    return value.strip() if isinstance(value, str) else ""


_STORE_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "the fact"}},
    "required": ["text"],
}
_RECALL_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RECALL_LIMIT},
    },
    "required": ["query"],
}
_FORGET_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "query": {"type": "string"}},
}


class MemoryTools:
    """The three memory tools over the store ``store_factory`` returns (called per call, so
    no Redis client is made before a tool runs)."""

    def __init__(self, store_factory: Callable[[], MemoryStore]):
        self._store = store_factory

    def store(self, ctx: RunContext, args: dict[str, Any]) -> str:
        text = _text(args, "text")
        try:
            fact, new = self._store().add_fact(text, TOOL_SOURCE)
        except MemoryRefused as e:
            ctx.audit.record("memory", "store", "error", text_sha256=audit.text_digest(text))
            raise ToolError(str(e)) from e
        ctx.audit.record("memory", "store", "ok", fact=fact.id, new=new,
                         text_sha256=audit.text_digest(text))
        return f"Remembered {_line(fact)}" if new else f"Already remembered as {_line(fact)}"

    def recall(self, ctx: RunContext, args: dict[str, Any]) -> str:
        limit = args.get("limit", DEFAULT_RECALL_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            limit = DEFAULT_RECALL_LIMIT
        query = _text(args, "query")
        facts = self._store().recall(query, min(limit, MAX_RECALL_LIMIT))
        ctx.audit.record("memory", "recall", "ok", facts=len(facts),
                         query_sha256=audit.text_digest(query))
        body = "\n".join(_line(f) for f in facts) if facts else "No remembered facts match."
        return fence("memory_recall", body)

    def forget(self, ctx: RunContext, args: dict[str, Any]) -> str:
        fact_id, query = _text(args, "id"), _text(args, "query")
        if not fact_id and not query:
            raise ToolError("give the id of a fact, or a query its text contains")
        try:
            gone = self._store().forget(fact_id=fact_id or None, query=query or None)
        except MemoryRefused as e:
            ctx.audit.record("memory", "forget", "error")
            raise ToolError(str(e)) from e
        ctx.audit.record("memory", "forget", "ok", facts=len(gone),
                         ids=",".join(f.id for f in gone)[:200] or None)
        if not gone:
            return "Nothing matched; nothing was forgotten."
        return "Forgot:\n" + "\n".join(_line(f) for f in gone)

    def tools(self) -> list[Tool]:
        return [
            Tool("memory_store", (
                "Remember a durable fact for later conversations (a preference, a name, a "
                "decision). One short sentence; repeats are stored once."
            ), _STORE_PARAMS, self.store, policy="read_write"),
            # The operator's facts are not a guest's to read.
            Tool("memory_recall", (
                "Search remembered facts. Returns the best matches with their ids; an empty "
                "query lists the most recent."
            ), _RECALL_PARAMS, self.recall, operator_only=True),
            Tool("memory_forget", (
                "Delete remembered facts for good: by id, or every fact containing a query "
                f"(at most {MAX_FORGET_AT_ONCE} at once)."
            ), _FORGET_PARAMS, self.forget, policy="read_write"),
        ]


def memory_tools(store_factory: Callable[[], MemoryStore]) -> list[Tool]:
    """The three memory tools (see :class:`MemoryTools`)."""
    return MemoryTools(store_factory).tools()
