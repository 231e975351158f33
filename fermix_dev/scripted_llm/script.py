"""Script model for the scripted LLM server: entries, the FIFO ``Script`` and the default responder.

Entries are pydantic dataclasses (positional args work: ``Reply("hi")``, ``Fail(429)``) and
round-trip through JSON with a ``"kind"`` discriminator::

    {"kind": "reply", "text": "hi", "tool_calls": [{"name": "f", "arguments": {}, "id": null}],
     "delay": 0.0, "chunk_delay": 0.0, "match": null, "usage": {"input_tokens": 1, "output_tokens": 2,
     "cache_read": 0, "cache_write": 0, "reasoning": 0}}
    {"kind": "fail", "status": 429, "message": "slow down", "retry_after": 7, "match": null}
    {"kind": "hang", "seconds": 30, "match": null}
    {"kind": "disconnect", "after_chunks": 2, "match": null, "text": "..."}
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter
from pydantic.dataclasses import dataclass as pyd_dataclass

from .prompt_cache import PromptCache


class _EntryBase:
    def to_json(self) -> dict[str, Any]:
        """Serialize to a JSON-compatible dict (including ``kind``)."""
        data: dict[str, Any] = ENTRY_ADAPTER.dump_python(self, mode="json")  # type: ignore[arg-type]
        return data


@pyd_dataclass
class ToolCallSpec:
    """One tool call the scripted model makes. ``id`` is generated when None."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@pyd_dataclass
class Usage:
    """Token usage to report; estimated from the request/reply when not given.

    ``input_tokens`` is every input token, the cached ones included; ``cache_read`` and
    ``cache_write`` are the part of them read from and written to the prompt cache, and
    ``reasoning`` the part of ``output_tokens`` spent thinking. Each wire reports them as its
    API does: Anthropic's ``input_tokens`` without the cache's (``cache_read_input_tokens``,
    ``cache_creation_input_tokens``, ``output_tokens_details.thinking_tokens``), OpenAI's
    ``prompt_tokens`` with them (``prompt_tokens_details.cached_tokens``,
    ``completion_tokens_details.reasoning_tokens``).
    """

    input_tokens: int
    output_tokens: int
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0

    @property
    def uncached_input(self) -> int:
        """The input tokens neither read from nor written to the cache."""
        return max(0, self.input_tokens - self.cache_read - self.cache_write)


@pyd_dataclass
class Reply(_EntryBase):
    """A successful assistant turn: text and/or tool calls.

    ``delay`` is slept before the first byte, ``chunk_delay`` between stream chunks.
    """

    text: str = ""
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    delay: float = 0.0
    chunk_delay: float = 0.0
    match: str | None = None
    usage: Usage | None = None
    # Reasoning shown before the answer: an Anthropic thinking block (with a signature), or
    # OpenAI-compatible `reasoning_content` deltas (vLLM/DeepSeek style).
    thinking: str = ""
    kind: Literal["reply"] = "reply"


@pyd_dataclass
class Fail(_EntryBase):
    """An HTTP error shaped like the provider's error body.

    ``retry_after`` (seconds) is sent as ``retry-after``/``retry-after-ms`` and, for 429, as
    provider-style rate-limit reset headers.
    """

    status: int = 500
    message: str = "scripted failure"
    retry_after: float | None = None
    match: str | None = None
    kind: Literal["fail"] = "fail"


@pyd_dataclass
class Hang(_EntryBase):
    """Accept the request, send nothing for ``seconds``, then close the connection."""

    seconds: float
    match: str | None = None
    kind: Literal["hang"] = "hang"


@pyd_dataclass
class Disconnect(_EntryBase):
    """Stream ``after_chunks`` SSE events of a reply with ``text``, then drop the connection.

    For non-streaming requests the connection is dropped without any response.
    """

    after_chunks: int = 0
    match: str | None = None
    text: str = "This scripted response is cut off by a disconnect."
    kind: Literal["disconnect"] = "disconnect"


Entry = Annotated[Reply | Fail | Hang | Disconnect, Field(discriminator="kind")]
ENTRY_ADAPTER: TypeAdapter[Reply | Fail | Hang | Disconnect] = TypeAdapter(Entry)
_ENTRIES_ADAPTER: TypeAdapter[list[Reply | Fail | Hang | Disconnect]] = TypeAdapter(list[Entry])


def entry_from_json(data: dict[str, Any]) -> Reply | Fail | Hang | Disconnect:
    """Parse one entry from its JSON dict (requires ``kind``)."""
    return ENTRY_ADAPTER.validate_python(data)


def entries_from_json(data: Any) -> list[Reply | Fail | Hang | Disconnect]:
    """Parse a list of entries, a single entry dict, or ``{"entries": [...]}``."""
    if isinstance(data, dict):
        data = data.get("entries", [data])
    return _ENTRIES_ADAPTER.validate_python(data)


@dataclass
class RequestView:
    """Provider-neutral view of a chat request, built by the wire modules."""

    last_user_text: str = ""
    # Tool results at the end of the conversation as (tool name or None, content text).
    tool_results: list[tuple[str | None, str]] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)
    model: str = "scripted-model"


class Script:
    """Thread-safe queue of scripted entries plus a log of received requests.

    ``next_for(text)`` returns the first queued entry whose ``match`` is a substring of
    ``text``; otherwise the first entry with ``match=None``; otherwise None (the server then
    falls back to :func:`default_reply`).
    """

    def __init__(self, *entries: Reply | Fail | Hang | Disconnect) -> None:
        self._lock = threading.Condition()
        self._entries: list[Reply | Fail | Hang | Disconnect] = list(entries)
        self._requests: list[dict[str, Any]] = []
        # Embeddings calls, apart: ``requests`` holds the model calls, each with messages.
        self._embeddings: list[dict[str, Any]] = []
        # (last user text, time.time()) of requests whose client hung up while we were silent.
        self._hangups: list[tuple[str, float]] = []
        # What earlier requests left in the providers' prompt caches (prompt_cache.py).
        self.prompt_cache = PromptCache()

    def push(self, *entries: Reply | Fail | Hang | Disconnect) -> None:
        """Append entries to the end of the queue."""
        with self._lock:
            self._entries.extend(entries)

    def next_for(self, request_text: str) -> Reply | Fail | Hang | Disconnect | None:
        """Pop and return the entry for a request whose last user message is ``request_text``."""
        with self._lock:
            for i, entry in enumerate(self._entries):
                if entry.match is not None and entry.match in request_text:
                    return self._entries.pop(i)
            for i, entry in enumerate(self._entries):
                if entry.match is None:
                    return self._entries.pop(i)
            return None

    def failure_for(self, request_text: str) -> Fail | None:
        """Pop the first queued :class:`Fail` whose ``match`` is in ``request_text`` (an
        embeddings request's inputs): embeddings fail only when a test says which."""
        with self._lock:
            for i, entry in enumerate(self._entries):
                if isinstance(entry, Fail) and entry.match is not None \
                        and entry.match in request_text:
                    self._entries.pop(i)
                    return entry
            return None

    def reset(self) -> None:
        """Drop all pending entries and recorded requests."""
        with self._lock:
            self._entries.clear()
            self._requests.clear()
            self._embeddings.clear()
            self._hangups.clear()
            self.prompt_cache.clear()

    def note_hangup(self, request_text: str) -> None:
        """The client of a request closed its connection before we answered."""
        with self._lock:
            self._hangups.append((request_text, time.time()))
            self._lock.notify_all()

    def wait_hangup(self, match: str, timeout: float) -> float | None:
        """When the client of a request whose last user text contains ``match`` hung up
        (``time.time()``), waiting up to ``timeout`` seconds for it; None if it did not."""
        def found() -> float | None:
            return next((t for text, t in self._hangups if match in text), None)

        with self._lock:
            self._lock.wait_for(lambda: found() is not None, timeout)
            return found()

    def record(self, request: dict[str, Any]) -> None:
        """Append a received-request record (``provider``, ``path``, ``body``, ``headers``...);
        an embeddings call's goes to :attr:`embedding_requests`."""
        with self._lock:
            embeds = str(request.get("path", "")).endswith("/embeddings")
            (self._embeddings if embeds else self._requests).append(request)
            self._lock.notify_all()

    def wait_request(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until a recorded request satisfies ``predicate``."""
        with self._lock:
            return self._lock.wait_for(lambda: any(predicate(r) for r in self._requests), timeout)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Snapshot of received model calls (chat / messages), oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def embedding_requests(self) -> list[dict[str, Any]]:
        """Snapshot of received embeddings calls, oldest first (``entry``: ``embeddings`` or
        ``fail``)."""
        with self._lock:
            return list(self._embeddings)

    @property
    def pending(self) -> list[Reply | Fail | Hang | Disconnect]:
        """Snapshot of entries not yet consumed."""
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


_TIME_RE = re.compile(r"\btime\b", re.IGNORECASE)
_CALC_RE = re.compile(
    r"\b(?:calculate|what\s+is)\s+([\d\s+\-*/().]*\d[\d\s+\-*/().]*)", re.IGNORECASE
)


def default_reply(view: RequestView) -> Reply:
    """The built-in deterministic "model" used when the script has no entry.

    1. Conversation ends with tool results -> ``Tool {name} returned: {content}`` (one line each).
    2. Last user text has the word "time" and ``current_time`` is offered -> call it with ``{}``.
    3. Last user text has ``calculate <expr>`` / ``what is <expr>`` (digits, spaces, ``+-*/().``)
       and ``calculator`` is offered -> call it with ``{"expression": expr}``.
    4. Otherwise -> ``Scripted reply: you said "<last user text>"``.
    """
    if view.tool_results:
        lines = [
            f"Tool {name} returned: {content}" if name else f"Tool returned: {content}"
            for name, content in view.tool_results
        ]
        return Reply(text="\n".join(lines))
    text = view.last_user_text
    if _TIME_RE.search(text) and "current_time" in view.tool_names:
        return Reply(tool_calls=[ToolCallSpec(name="current_time", arguments={})])
    calc = _CALC_RE.search(text)
    if calc and "calculator" in view.tool_names:
        expr = calc.group(1).strip().rstrip(".").strip()
        return Reply(tool_calls=[ToolCallSpec(name="calculator", arguments={"expression": expr})])
    return Reply(text=f'Scripted reply: you said "{text}"')


def estimate_usage(reply: Reply, messages: Any) -> Usage:
    """``reply.usage`` if set, else a rough chars/4 estimate of prompt and completion."""
    if reply.usage is not None:
        return reply.usage
    prompt = len(json.dumps(messages, default=str)) // 4 + 1
    completion = len(reply.text) // 4 + 1
    completion += sum(len(json.dumps(tc.arguments)) // 4 + 1 for tc in reply.tool_calls)
    return Usage(input_tokens=prompt, output_tokens=completion)


def split_text(text: str) -> list[str]:
    """Split text into small stream deltas (one word plus its leading whitespace each)."""
    return re.findall(r"\s*\S+|\s+$", text) if text else []


def split_json(data: str, size: int = 16) -> list[str]:
    """Split a JSON string into ``size``-character fragments for streamed tool arguments."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [""]
