"""ConversationStore: a conversation's history as a Redis list of JSON ChatMessages."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis

from fermix_shared import keys, lua
from fermix_shared.messages import ChatMessage


def load(r: redis.Redis, conv: str, limit: int) -> list[ChatMessage]:
    """The last ``limit`` messages, starting at a user message.

    Trimming may cut between an assistant's tool calls and their results; a window that does
    not start at a user message would be refused by the providers, so it is advanced to one.
    """
    raw: list[str] = r.lrange(keys.history(conv), -limit, -1)  # type: ignore[assignment]
    return window(raw)


def window(raw: Sequence[str | bytes]) -> list[ChatMessage]:
    """:func:`load` over the entries as read (``LRANGE history -limit -1``)."""
    msgs = [ChatMessage.model_validate_json(x) for x in raw]
    for i, m in enumerate(msgs):
        if m.role == "user":
            return msgs[i:]
    return []


async def recent_async(r: aioredis.Redis, conv: str, limit: int) -> tuple[int, list[ChatMessage]]:
    """The conversation's length and its last ``limit`` messages as stored (the console's
    transcript: no window adjustment)."""
    async with r.pipeline(transaction=False) as pipe:
        pipe.llen(keys.history(conv))
        pipe.lrange(keys.history(conv), -limit, -1)
        length, raw = await pipe.execute()
    return int(length), [ChatMessage.model_validate_json(x) for x in raw]


def load_all(r: redis.Redis, conv: str) -> tuple[list[str], list[ChatMessage]]:
    """The whole stored history, raw and parsed (compaction plans over all of it)."""
    raw: list[str] = r.lrange(keys.history(conv), 0, -1)  # type: ignore[assignment]
    return raw, [ChatMessage.model_validate_json(x) for x in raw]


def replace_prefix(r: redis.Redis, conv: str, raw_prefix: list[str], checkpoint: ChatMessage) -> bool:
    """Swap the stored ``raw_prefix`` for ``checkpoint`` atomically; False if history changed."""
    if not raw_prefix:
        return False
    done = lua.REPLACE_PREFIX(r, history=keys.history(conv), prefix_len=len(raw_prefix),
                              prefix_last=raw_prefix[-1], checkpoint=checkpoint.model_dump_json())
    return bool(done)


def append(r: redis.Redis, conv: str, messages: list[ChatMessage]) -> None:
    if messages:
        r.rpush(keys.history(conv), *(m.model_dump_json() for m in messages))


def save_measurement(r: redis.Redis | redis.client.Pipeline, conv: str, prompt_tokens: int,
                     model: str) -> None:
    """The provider-reported prompt size of the conversation's last turn (gates preflight);
    queued only, when ``r`` is a pipeline."""
    r.set(keys.conv_usage(conv), json.dumps({"prompt_tokens": prompt_tokens, "model": model}),
          ex=keys.RUN_TTL_SECONDS)


def measurement(r: redis.Redis, conv: str) -> tuple[int, str] | None:
    return measurement_from(r.get(keys.conv_usage(conv)))


def measurement_from(raw: Any) -> tuple[int, str] | None:
    """:func:`measurement` over ``keys.conv_usage(conv)`` as read (None when absent)."""
    if not raw:
        return None
    data = json.loads(raw)
    return int(data["prompt_tokens"]), str(data["model"])


def clear_measurement(r: redis.Redis, conv: str) -> None:
    r.delete(keys.conv_usage(conv))
