"""ConversationStore: a conversation's history as a Redis list of JSON ChatMessages."""

from __future__ import annotations

import redis

from fermix_shared import keys
from fermix_shared.messages import ChatMessage


def load(r: redis.Redis, conv: str, limit: int) -> list[ChatMessage]:
    """The last ``limit`` messages, starting at a user message.

    Trimming may cut between an assistant's tool calls and their results; a window that does
    not start at a user message would be refused by the providers, so it is advanced to one.
    """
    raw: list[str] = r.lrange(keys.history(conv), -limit, -1)  # type: ignore[assignment]
    msgs = [ChatMessage.model_validate_json(x) for x in raw]
    for i, m in enumerate(msgs):
        if m.role == "user":
            return msgs[i:]
    return []


def append(r: redis.Redis, conv: str, messages: list[ChatMessage]) -> None:
    if messages:
        r.rpush(keys.history(conv), *(m.model_dump_json() for m in messages))
