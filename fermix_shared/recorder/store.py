"""A run's record in Redis: one list of JSON entries (:mod:`~fermix_shared.recorder.entries`)
and its size, under one hash tag (``{rec:<run id>}``), appended by one script
(``record_append.lua``) that enforces ``[recorder] max_bytes`` and the retention."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis

from fermix_shared import keys, lua
from fermix_shared.messages import ChatMessage
from fermix_shared.recorder.config import RecorderConfig
from fermix_shared.recorder.entries import (
    ENTRY,
    Cut,
    End,
    Entry,
    ModelCall,
    Request,
    Start,
    Steer,
    ToolRun,
)


def append(r: redis.Redis, run_id: str, entry: Entry, config: RecorderConfig,
           mask: Callable[[str], str] | None = None) -> bool:
    """Append ``entry`` (masked by ``mask``) to the run's record; False once the record is cut."""
    text = entry.model_dump_json(exclude_none=True)
    if mask is not None:
        text = mask(text)
    cut = Cut(max_bytes=config.max_bytes).model_dump_json()
    return bool(lua.RECORD_APPEND(r, record=keys.run_record(run_id),
                                  size=keys.run_record_size(run_id), entry=text,
                                  max_bytes=config.max_bytes, ttl_s=config.ttl_s, cut=cut))


@dataclass
class Recording:
    """A run's record, read back: the model calls by index (the last written of an index
    wins: a call re-issued after a crash), the tool runs by call id, the steered messages by
    the index of the model call they preceded."""

    run_id: str
    entries: list[Entry]
    start: Start | None = None
    calls: dict[int, ModelCall] = field(default_factory=dict)
    tools: dict[str, ToolRun] = field(default_factory=dict)
    steers: dict[int, list[str]] = field(default_factory=dict)
    end: End | None = None
    cut: Cut | None = None
    size: int = 0

    def requests(self) -> dict[int, Request]:
        """Every model call's request in full, by call index (each entry holds what changed
        since the request before it in the record)."""
        out: dict[int, Request] = {}
        system: str | None = None
        tools: list[dict[str, Any]] | None = None
        messages: list[ChatMessage] = []
        for entry in self.entries:
            if not isinstance(entry, ModelCall):
                continue
            req = entry.request
            system = req.system if req.system is not None else system
            tools = req.tools if req.tools is not None else tools
            messages = [*messages[:req.messages_from], *req.messages]
            out[entry.i] = req.model_copy(update={
                "system": system, "tools": tools, "messages_from": 0, "messages": messages})
        return out

    @classmethod
    def of(cls, run_id: str, raw: list[str]) -> Recording:
        out = cls(run_id, [], size=sum(len(x) for x in raw))
        for line in raw:
            entry = ENTRY.validate_python(json.loads(line))
            out.entries.append(entry)
            match entry:
                case Start():
                    out.start = entry
                case ModelCall():
                    out.calls[entry.i] = entry
                case ToolRun():
                    out.tools[entry.call.id] = entry
                case Steer():
                    out.steers.setdefault(entry.i, []).extend(entry.texts)
                case End():
                    out.end = entry
                case Cut():
                    out.cut = entry
        return out


def read(r: redis.Redis, run_id: str) -> Recording | None:
    """The run's record, or None when it has none (recorder off, expired, never ran)."""
    raw = r.lrange(keys.run_record(run_id), 0, -1)
    return Recording.of(run_id, [x.decode() if isinstance(x, bytes) else x for x in raw]) \
        if raw else None


async def read_async(r: aioredis.Redis, run_id: str) -> Recording | None:
    """As :func:`read`, for the gateway."""
    raw = await r.lrange(keys.run_record(run_id), 0, -1)
    return Recording.of(run_id, [x.decode() if isinstance(x, bytes) else x for x in raw]) \
        if raw else None


async def exists_async(r: aioredis.Redis, run_id: str) -> bool:
    """Whether the run has a record."""
    return bool(await r.exists(keys.run_record(run_id)))


async def size_async(r: aioredis.Redis, run_id: str) -> tuple[int, int]:
    """The record's entries and bytes."""
    raw = await r.lrange(keys.run_record(run_id), 0, -1)
    return len(raw), sum(len(x) for x in raw)
