"""Conversations, for the console and scripts (viewer role):

* ``GET /v1/conversations?q=&state=&offset=&limit=``: every conversation, the most recently
  active first, with its channel, agent, state (``approval``, ``running``, ``paused``,
  ``over_budget``, ``queued``, ``idle``), queued messages and last activity; ``q`` matches a part of the key or
  the agent, ``state`` one state; ``limit`` at most 200 (default 50). ``{"total",
  "offset", "conversations": [...]}``.
* ``GET /v1/conversations/{key}`` (``channel|chat|thread``, percent-encoded): its transcript
  (the last ``limit`` messages, default 200), ``why`` (one sentence: why it waits, from the
  real state), the running turn's ``runId`` (its events at ``/v1/runs/{runId}/events``).
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Query, Request

from fermix_gateway.api.run_bodies import ConversationDetail, ConversationPage
from fermix_gateway.api.wire import refusals, v1_router
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.stores import conversations, history
from fermix_shared.stores.conversations import ConversationState

router = v1_router()


@router.get("/conversations", response_model=ConversationPage)
async def list_conversations(
    request: Request, q: str = Query(default="", max_length=200),
    state: ConversationState | None = None, offset: int = Query(default=0, ge=0),
    limit: int = Query(default=50, ge=1, le=conversations.MAX_PAGE),
) -> dict[str, Any]:
    page = await conversations.page_async(request.app.state.redis, q=q, state=state,
                                          offset=offset, limit=limit)
    return {"total": page.total, "offset": page.offset,
            "conversations": [row.as_json() for row in page.rows]}


def message_json(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["toolCalls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.tool_name:
        out["toolName"] = m.tool_name
    if m.is_error:
        out["isError"] = True
    return out


async def conversation_detail(request: Request, key: str, limit: int) -> dict[str, Any]:
    """A conversation's transcript, state sentence and running turn (404 if never seen)."""
    r = request.app.state.redis
    length, messages = await history.recent_async(r, key, limit)
    if not length and await r.zscore(keys.conversations(), key) is None:
        raise HTTPException(404, f"no conversation {key!r}")
    running = await r.hget(keys.active(key), "turn_id")
    return {"conversation": key, "length": length, "why": await conversations.why_async(r, key),
            "runId": running or None, "messages": [message_json(m) for m in messages]}


@router.get("/conversations/{key:path}", response_model=ConversationDetail,
            responses=refusals({404: "No such conversation.",
                                422: "A bad `limit`, or a key that is not `channel|chat|thread`."}))
async def get_conversation(request: Request, key: str,
                           limit: int = Query(default=200, ge=1, le=1000)) -> dict[str, Any]:
    if key.count("|") < 2:
        raise HTTPException(422, "key: a conversation is channel|chat|thread")
    return await conversation_detail(request, key, limit)
