"""The run API: start a run, read it, wait for it, stream its events."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fermix_gateway import commands
from fermix_gateway.api.run_bodies import EVENT_STREAM, Accepted, Run, RunWait, Timeline
from fermix_gateway.api.schemas import AgentRequest, ms, run_json, wait_json
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Caller, Operator
from fermix_gateway.inbound import (
    accept_limits,
    audit_trust,
    enqueue,
    refusal_notice,
    retry_after_seconds,
    task_sender,
)
from fermix_gateway.waits import OUTAGE_GRACE_S, RunWaits, ride_out
from fermix_shared import keys
from fermix_shared.agents.definitions import agent_named, agent_names, bound_agent
from fermix_shared.models import (
    ConversationKey,
    InboundMessage,
    RunProfile,
    RunRecord,
    RunStatus,
    new_run_id,
    now,
)
from fermix_shared.run_events import CommandAnswered
from fermix_shared.settings import Settings
from fermix_shared.stores import events, runs, timeline
from fermix_shared.stores.queue import AcceptCode

log = logging.getLogger(__name__)
router = v1_router()
NO_RUN = refusals({404: "No such run."})

MAX_WAIT_SECONDS = 3600.0
# Fased's ``agent.wait`` default: "30s (just the wait). `timeoutMs` param overrides."
DEFAULT_WAIT_SECONDS = 30.0
# After a run's terminal event, how long its SSE stream may stay open for a scheduled
# post-turn compaction (counted from that event, so a late replay closes at once): it runs
# next in the conversation, this bounds one that never reports.
COMPACTION_FOLLOW_SECONDS = 300.0


async def _record(request: Request, run_id: str) -> RunRecord:
    rec = await runs.get_async(request.app.state.redis, run_id)
    if rec is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return rec


async def _command_run(request: Request, key: ConversationKey, reply: str) -> RunRecord:
    """A command is answered at once: its run is created already ended."""
    r = request.app.state.redis
    t = now()
    rec = RunRecord(run_id=new_run_id(), conversation=key, status=RunStatus.ok, reply=reply,
                    accepted_at=t, started_at=t, ended_at=t)
    await runs.put_async(r, rec)
    await events.emit_async(r, rec.run_id, CommandAnswered(reply=reply, ended_at=t))
    return rec


@dataclass(frozen=True)
class Started:
    """A message accepted (queued, steered, a duplicate of one, or a command answered at once):
    its run to follow."""

    run_id: str
    accepted_at: float
    duplicate: bool = False


@dataclass(frozen=True)
class Refused:
    """A message not taken, and why: ``status`` is what ``POST /v1/agent`` answers (422 too
    long or no such agent, 409 a busy conversation in queue mode ``reject``, 429 a full queue
    or a sender over its rate, then with ``retry_after`` seconds)."""

    status: int
    reason: str
    retry_after: int | None = None


async def start_message(
    request: Request, key: ConversationKey, message: str, *, agent: str | None = None,
    profile: RunProfile = "default", message_id: str | None = None, verbose: bool | None = None,
    caller: Caller | None = None,
) -> Started | Refused:
    """The HTTP start path, shared by ``POST /v1/agent`` and the OpenAI-compatible API: the
    caller is the bearer-token holder (an operator, audited as ``http:api``); a command is
    handled as one; anything else is durable in the conversation's inbox before this returns.
    ``agent`` unset: the bindings choose. ``message_id`` makes a retry run one turn.
    ``verbose``: tool details on the run's stream (None: the operator's default). ``caller``:
    the token that sent it (audited as its actor; on the ``console`` channel, the sender)."""
    actor = caller.actor if caller is not None else "http:api"
    sender = caller.name if caller is not None and key.channel == "console" else "api"
    settings = request.app.state.settings
    limit = settings.limits.max_text_chars
    if len(message) > limit:
        return Refused(422, f"message: at most {limit} characters, got {len(message)} "
                            "(FERMIX_LIMITS__MAX_TEXT_CHARS)")
    agent = agent or bound_agent(settings.bindings, key)
    if (problem := agent_problem(settings, agent)) is not None:
        return Refused(422, problem)
    text = message
    # Bearer token holders are operators: the trust decision, audited.
    await audit_trust(request.app.state.redis, key, actor, "operator", message, agent)
    if cmd := commands.parse_command(message):
        out = await commands.handle(request.app.state.redis, settings, key, cmd,
                                    commands.Caller(actor, "operator"), request.app.state.hooks,
                                    send=task_sender(request))
        if out.control == "compact":
            job = InboundMessage(key=key, text="/compact", kind="compact", compact_reason="command",
                                 agent=agent)
            accepted = await enqueue(request, job, message_id=message_id)
            return Started(accepted.run_id, job.accepted_at, accepted.code is AcceptCode.duplicate)
        if out.run_text is None:
            rec = await _command_run(request, key, out.reply or "")
            return Started(rec.run_id, rec.accepted_at)
        text, profile = out.run_text, out.profile
    msg = InboundMessage(key=key, text=text, profile=profile, trust="operator", agent=agent,
                         verbose=verbose, sender_id=sender)
    # The HTTP API has one caller (the token holder); the chat stands for the user.
    accepted = await enqueue(request, msg, message_id=message_id,
                             limits=accept_limits(settings, f"http:{key.chat_id}"))
    if accepted.code is AcceptCode.full:
        return Refused(429, refusal_notice(settings, accepted))
    if accepted.code is AcceptCode.rate_limited:
        return Refused(429, refusal_notice(settings, accepted), retry_after_seconds(accepted))
    if accepted.code is AcceptCode.refused:
        return Refused(409, "a turn is already running or queued in this conversation "
                            "(queue mode 'reject'); try again when it has finished")
    return Started(accepted.run_id, msg.accepted_at, accepted.code is AcceptCode.duplicate)


@router.post("/agent", status_code=202, response_model=Accepted, responses=refusals({
    409: "A turn is running or queued in the conversation, in queue mode `reject`.",
    422: "A bad body, a message over `limits.max_text_chars`, or no such (`main`) agent.",
    429: "The conversation's queue is full, or the chat is over its rate (`Retry-After`).",
}))
async def start_run(body: AgentRequest, request: Request,
                    who: Operator) -> dict[str, Any] | JSONResponse:
    """Accept a message: durable in the conversation's inbox before we answer.

    Refused with a reason: a message over ``max_text_chars`` (422), a conversation with
    ``max_queued_per_conversation`` messages waiting or a chat past its
    ``sender_messages_per_minute`` (429, the latter with ``Retry-After``)."""
    key = ConversationKey(channel="http", chat_id=str(body.chatId), thread_scope=body.threadScope or "root")
    out = await start_message(request, key, body.message, agent=body.agent, profile=body.profile,
                              message_id=body.messageId, verbose=body.verbose, caller=who)
    if isinstance(out, Refused):
        headers = None if out.retry_after is None else {"Retry-After": str(out.retry_after)}
        return JSONResponse({"error": out.reason}, status_code=out.status, headers=headers)
    return {"runId": out.run_id, "acceptedAt": ms(out.accepted_at), "duplicate": out.duplicate}


def agent_problem(settings: Settings, name: str) -> str | None:
    """Why ``name`` cannot answer a message (unknown, or a ``sub`` agent), or None."""
    agent = agent_named(settings.agents, name)
    if agent is None:
        return (f"agent: no agent named {name!r}; declared agents: "
                f"{', '.join(agent_names(settings.agents))}")
    if agent.role != "main":
        return f"agent: {name!r} is a 'sub' agent (run through skill_run), not one that answers chats"
    return None


@router.get("/runs/{run_id}", response_model=Run, responses=NO_RUN)
async def get_run(run_id: str, request: Request) -> dict[str, Any]:
    return run_json(await _record(request, run_id))


# After a lifecycle error, how long ``wait`` gives the run to start again (Fased: transient
# errors get a short grace so a retry can emit a new start).
WAIT_ERROR_GRACE_SECONDS = 3.0


async def wait_for_end(request: Request, run_id: str, timeout: float) -> tuple[RunRecord, bool]:
    """The run's record once it has ended (lifecycle end/error), or as it is when ``timeout``
    seconds pass or the client goes away; and whether it had not ended then. Its reads ride
    out a short Redis outage (:func:`fermix_gateway.waits.ride_out`), within the timeout."""
    deadline = time.monotonic() + timeout

    def record() -> Awaitable[RunRecord]:
        return ride_out(lambda: _record(request, run_id),
                        min(OUTAGE_GRACE_S, max(0.0, deadline - time.monotonic())))

    rec = await record()
    if rec.status.terminal:
        return rec, False
    grace_until: float | None = None
    followed_events = run_waits(request).follow(
        run_id, grace_s=min(OUTAGE_GRACE_S, max(0.0, deadline - time.monotonic())))
    async with aclosing(followed_events) as followed:
        async for ev in followed:
            if ev is not None and ev.terminal:
                return await record(), False
            if ev is not None and ev.stream == "lifecycle":
                # A transient error starts the grace; a new start ends it.
                grace_until = (
                    time.monotonic() + WAIT_ERROR_GRACE_SECONDS
                    if ev.data.get("phase") == "error" else None
                )
            now_ = time.monotonic()
            if grace_until is not None and now_ >= grace_until:
                rec = await record()
                if rec.status.terminal:
                    return rec, False
                grace_until = None
            if now_ >= deadline or (ev is None and await request.is_disconnected()):
                break
    return await record(), True


def run_waits(request: Request) -> RunWaits:
    """The app's shared reader of run events for waits (:mod:`fermix_gateway.waits`), made
    on first use over the app's Redis client."""
    state = request.app.state
    waits: RunWaits | None = getattr(state, "run_waits", None)
    if waits is None or waits.redis is not state.redis:
        waits = state.run_waits = RunWaits(state.redis)
    return waits


@router.get("/runs/{run_id}/wait", response_model=RunWait, responses=NO_RUN)
async def wait_run(
    run_id: str,
    request: Request,
    timeout: float | None = Query(None, ge=0, le=MAX_WAIT_SECONDS, description="seconds"),
    timeout_ms: int | None = Query(None, alias="timeoutMs", ge=0, le=int(MAX_WAIT_SECONDS * 1000),
                                   description="milliseconds (Fased's agent.wait); wins over timeout"),
) -> dict[str, Any]:
    """Block until the run ends (lifecycle end/error) or the wait's timeout passes:
    ``timeoutMs`` milliseconds, else ``timeout`` seconds, else 30 s. Only the wait ends: the
    run goes on."""
    seconds = (timeout_ms / 1000 if timeout_ms is not None
               else DEFAULT_WAIT_SECONDS if timeout is None else timeout)
    rec, timed_out = await wait_for_end(request, run_id, seconds)
    return wait_json(rec, timed_out=timed_out)


def _compaction_pending(pending: bool, ev: events.RunEvent) -> bool:
    """Whether a post-turn compaction is still to report after ``ev``: ``scheduled`` until its
    ``end``, ``error`` or ``cancelled``."""
    if ev.stream != "compaction":
        return pending
    phase = ev.data.get("phase")
    if phase == "scheduled":
        return True
    return pending and phase not in ("end", "error", "cancelled")


def _entry_seconds(entry_id: str) -> float:
    """When a stream entry was written (its id is ``<ms>-<seq>``)."""
    return int(entry_id.split("-", 1)[0]) / 1000


async def _sse(request: Request, run_id: str, after: str) -> AsyncIterator[str]:
    """The run's events until its terminal one, or, when a post-turn compaction was scheduled
    before it, until that compaction reports its end (at most COMPACTION_FOLLOW_SECONDS)."""
    pending, closes_at = False, None
    async for ev in events.follow(request.app.state.redis, run_id, after=after, block_ms=1000):
        if await request.is_disconnected():
            return
        if ev is None:
            yield ": keepalive\n\n"
        else:
            yield f"id: {ev.id}\nevent: {ev.stream}\ndata: {json.dumps(ev.data)}\n\n"
            pending = _compaction_pending(pending, ev)
            if ev.terminal:
                closes_at = _entry_seconds(ev.id) + COMPACTION_FOLLOW_SECONDS
        if closes_at is not None and (not pending or time.time() >= closes_at):
            return


@router.get("/runs/{run_id}/events", response_class=StreamingResponse,
            responses={200: EVENT_STREAM, **NO_RUN})
async def run_events(run_id: str, request: Request) -> StreamingResponse:
    """SSE of the run's events, replayed from the start (or after ``Last-Event-ID``)."""
    await _record(request, run_id)
    after = request.headers.get("last-event-id") or "0"
    return StreamingResponse(
        _sse(request, run_id, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/runs/{run_id}/timeline", response_model=Timeline, responses=NO_RUN)
async def get_timeline(run_id: str, request: Request) -> dict[str, Any]:
    """The run's timeline (fermix_shared/stores/timeline.py): model calls with tokens, cost
    and latency; tool calls with their duration; compaction, diagnostics, start and end."""
    r = request.app.state.redis
    if not await r.exists(keys.run(run_id)):
        raise HTTPException(404, f"no run {run_id!r}")
    return {"runId": run_id, "entries": await timeline.timeline_async(r, run_id)}
