"""The console's views, each from the same stores the ``/v1`` API reads:

* ``/console``: the fleet (worker processes with their heartbeat age, slots and turns in
  flight, gateways, the beat leader, Redis, turns and errors a minute, queue counts, agents,
  running and waiting conversations), from ``GET /v1/fleet`` and ``/v1/status``'s data,
  refreshed every 5 s;
* ``/console/conversations``: every conversation (fermix_shared/stores/conversations.py),
  filtered by state and searched by key or agent, 50 a page;
* ``/console/approvals``: the pending approvals, answered through ``POST /v1/approvals/{id}``,
  and the last 20 answered (approved, denied, cancelled, expired) with who answered, from the
  audit trail;
* ``/console/agents``: each agent's state, paused and resumed (operators) and killed (admins)
  through ``/v1/agents``, and the bindings that route chats to them;
* ``/console/run/{runId}``: a run's timeline (fermix_shared/stores/timeline.py), and its flight
  record replayed or forked (operators);
* ``/console/conversation?key=channel|chat|thread``: the transcript (the last
  :data:`TRANSCRIPT_LIMIT` messages), the running turn live (its run's event stream) and, for
  an operator, a box to talk to the agent in that conversation (HTTP chats) or in a console
  chat of its own (``/console/chat``).

A page without a live session redirects to the sign-in. Actions are the script's, with the
session's CSRF token; the buttons of a role that may not are not drawn, and the API refuses
them anyway.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from fermix_gateway.api.agents import agent_activity, agent_json
from fermix_gateway.api.approvals import approval_json
from fermix_gateway.api.fleet import fleet_json
from fermix_gateway.api.runs import Refused, start_message
from fermix_gateway.api.status import get_status
from fermix_gateway.auth import Operator
from fermix_gateway.console.render import page, signed_in, to_login
from fermix_shared import keys
from fermix_shared import recorder as rec
from fermix_shared.access.tokens import allows
from fermix_shared.approvals import store as approvals
from fermix_shared.audit import store as audit_store
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.stores import conversations, history, runs, timeline

router = APIRouter(prefix="/console", include_in_schema=False)
TRANSCRIPT_LIMIT = 200
PAGE = 50
ANSWERED_SCAN, ANSWERED_SHOWN = 1000, 20
QUEUED_SHOWN = 20


@router.get("")
async def fleet(request: Request) -> Response:
    if (caller := await signed_in(request)) is None:
        return to_login()
    status, parts = await get_status(request), await fleet_json(request)
    for m in parts["turnsPerMinute"]:
        m["label"] = datetime.fromtimestamp(m["minute"] / 1000, UTC).strftime("%H:%M")
    return page(request, "fleet.html", caller, fleet=status, parts=parts)


@router.get("/conversations")
async def conversations_page(
    request: Request, q: str = Query(default="", max_length=200),
    state: str = Query(default="", max_length=20), offset: int = Query(default=0, ge=0),
) -> Response:
    if (caller := await signed_in(request)) is None:
        return to_login()
    chosen = next((s for s in conversations.STATES if s == state), None)
    found = await conversations.page_async(request.app.state.redis, q=q, state=chosen,
                                           offset=offset, limit=PAGE)
    return page(request, "conversations.html", caller, rows=found.rows, total=found.total,
                offset=offset, page_size=PAGE, q=q, state=chosen or "",
                states=conversations.STATES, now_ms=time.time() * 1000)


@router.get("/approvals")
async def approvals_page(request: Request) -> Response:
    if (caller := await signed_in(request)) is None:
        return to_login()
    r = request.app.state.redis
    waiting = [approval_json(a) for a in await approvals.pending_async(r)]
    # The answered ones, newest first, from the audit trail (who answered, and how).
    answered = [e for e in await audit_store.recent_async(r, limit=ANSWERED_SCAN)
                if e.kind == "approval"][:ANSWERED_SHOWN]
    return page(request, "approvals.html", caller, approvals=waiting, answered=answered,
                may_answer=allows(caller.role, "operator"))


@router.get("/agents")
async def agents_page(request: Request) -> Response:
    if (caller := await signed_in(request)) is None:
        return to_login()
    r, settings = request.app.state.redis, request.app.state.settings
    found = [agent_json(a, settings) for a in await agent_activity(r, settings)]
    return page(request, "agents.html", caller, agents=found, bindings=settings.bindings,
                may_act=allows(caller.role, "operator"), may_kill=allows(caller.role, "admin"))


def _key_of(text: str) -> ConversationKey | None:
    channel, sep, rest = text.partition("|")
    chat, sep2, thread = rest.rpartition("|")
    if not (sep and sep2 and chat and thread):
        return None
    try:
        return ConversationKey(channel=channel, chat_id=chat, thread_scope=thread)  # type: ignore[arg-type]
    except ValueError:
        return None


@router.get("/conversation")
async def conversation_page(request: Request, key: str = Query(max_length=600)) -> Response:
    if (caller := await signed_in(request)) is None:
        return to_login()
    conv = _key_of(key)
    if conv is None:
        return page(request, "error.html", caller, status=404,
                    error=f"No conversation is keyed {key!r} (channel|chat|thread).")
    r = request.app.state.redis
    length, messages = await history.recent_async(r, conv.as_str(), TRANSCRIPT_LIMIT)
    active: dict[str, Any] = await r.hgetall(keys.active(conv.as_str()))
    why = await conversations.why_async(r, conv.as_str())
    recent = await runs.recent_of_async(r, conv.as_str())
    waiting = [InboundMessage.model_validate_json(m).text
               for m in await r.lrange(keys.inbox(conv.as_str()), 0, QUEUED_SHOWN - 1)]
    return page(request, "conversation.html", caller, key=conv.as_str(), conv=conv, why=why,
                recent=recent, waiting=waiting,
                length=length, messages=messages, running=active.get("turn_id", ""),
                may_talk=allows(caller.role, "operator") and conv.channel in ("http", "console"),
                may_act=allows(caller.role, "operator"))


@router.get("/run/{run_id}")
async def run_page(request: Request, run_id: str) -> Response:
    """A run's timeline: model calls (tokens, cost, latency), tool calls (duration, result),
    retries, failover, compaction, its start and end."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    r = request.app.state.redis
    record = await runs.get_async(r, run_id)
    if record is None:
        return page(request, "error.html", caller, status=404, error=f"No run {run_id!r}.")
    entries = await timeline.timeline_async(r, run_id)
    start = entries[0]["at"] if entries else 0
    total = sum(e.get("usdMicros") or 0 for e in entries if e["type"] == "model")
    # Its flight record (docs/features/replay.md): replayed or forked from here.
    kept, size = await rec.size_async(r, run_id)
    return page(request, "run.html", caller, run=record, entries=entries, start=start,
                usd=total / 1e6, calls=sum(1 for e in entries if e["type"] == "model"),
                record={"entries": kept, "bytes": size} if kept else None,
                may_act=allows(caller.role, "operator"))


class ConsoleMessage(BaseModel):
    """What the console's chat box sends: the text, the console chat and the agent."""

    model_config = ConfigDict(extra="forbid")
    message: str = Field(min_length=1)
    chatId: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")  # noqa: N815
    agent: str | None = Field(default=None, max_length=64)


@router.post("/send", status_code=202)
async def send(body: ConsoleMessage, request: Request, who: Operator) -> JSONResponse:
    """A message from the console's chat: a turn in the ``console`` channel, sent by the
    signed-in token (its sender and its audit actor), answered on the run's event stream."""
    key = ConversationKey(channel="console", chat_id=body.chatId, thread_scope="root")
    out = await start_message(request, key, body.message, agent=body.agent, caller=who)
    if isinstance(out, Refused):
        return JSONResponse({"error": out.reason}, status_code=out.status)
    return JSONResponse({"runId": out.run_id, "conversation": key.as_str()}, status_code=202)


class ConsoleAction(BaseModel):
    """A conversation action from its view: stop its turn (and clear what is queued),
    compact it, or start a new session."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(max_length=600)
    action: Literal["stop", "compact", "new"]


@router.post("/act", status_code=202)
async def act(body: ConsoleAction, request: Request, who: Operator) -> JSONResponse:
    """The action as its chat command (``/stop``, ``/compact``, ``/new``) in the conversation,
    sent by the signed-in token: audited like the command, answered by its run's reply."""
    conv = _key_of(body.key)
    if conv is None:
        return JSONResponse({"error": f"key: no conversation is keyed {body.key!r}"},
                            status_code=422)
    out = await start_message(request, conv, f"/{body.action}", caller=who)
    if isinstance(out, Refused):
        return JSONResponse({"error": out.reason}, status_code=out.status)
    return JSONResponse({"runId": out.run_id}, status_code=202)


@router.get("/chat")
async def chat_page(request: Request, agent: str = Query(default="default", max_length=64)
                    ) -> Response:
    """A new console conversation with ``agent``, in the ``console`` channel."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    chat = f"{caller.name}-{uuid.uuid4().hex[:8]}"
    conv = ConversationKey(channel="console", chat_id=chat, thread_scope="root")
    return page(request, "conversation.html", caller, key=conv.as_str(), conv=conv, length=0,
                messages=[], running="", agent=agent,
                may_talk=allows(caller.role, "operator"))
