"""The run API: start a run, read it, wait for it, stream its events."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fermix_gateway import commands
from fermix_gateway.auth import require_token
from fermix_gateway.schemas import AgentRequest, ms, run_json, wait_json
from fermix_shared import metrics
from fermix_shared.celery_app import DISPATCH_TASK
from fermix_shared.models import (
    ConversationKey,
    InboundMessage,
    RunRecord,
    RunStatus,
    new_run_id,
    now,
)
from fermix_shared.stores import events, queue, runs
from fermix_shared.stores.queue import AcceptCode

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])

MAX_WAIT_SECONDS = 3600.0


async def _record(request: Request, run_id: str) -> RunRecord:
    rec = await runs.get_async(request.app.state.redis, run_id)
    if rec is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return rec


async def _command_run(request: Request, key: ConversationKey, cmd: commands.Command) -> RunRecord:
    """A command is answered at once: its run is created already ended."""
    r = request.app.state.redis
    reply = await commands.handle(r, request.app.state.settings, key, cmd)
    t = now()
    rec = RunRecord(run_id=new_run_id(), conversation=key, status=RunStatus.ok, reply=reply,
                    accepted_at=t, started_at=t, ended_at=t)
    await runs.put_async(r, rec)
    await events.emit_async(r, rec.run_id, "lifecycle", phase="end", status="ok", reply=reply,
                            endedAt=t)
    return rec


@router.post("/agent", status_code=202)
async def start_run(body: AgentRequest, request: Request) -> JSONResponse:
    """Accept a message: durable in the conversation's inbox before we answer."""
    r = request.app.state.redis
    settings = request.app.state.settings
    key = ConversationKey(channel="http", chat_id=str(body.chatId), thread_scope=body.threadScope or "root")
    conv = key.as_str()
    if cmd := commands.parse_command(body.message):
        rec = await _command_run(request, key, cmd)
        return JSONResponse({"runId": rec.run_id, "acceptedAt": ms(rec.accepted_at),
                             "duplicate": False}, status_code=202)

    mode = settings.queue_mode_for(key.channel, await queue.queue_mode_async(r, conv))
    if mode == "interrupt":
        await commands.stop(r, key, reason="interrupt")
    msg = InboundMessage(key=key, text=body.message, profile=body.profile, trust="operator")
    accepted = await queue.accept_async(r, msg, mode=mode, message_id=body.messageId)
    if accepted.code is AcceptCode.refused:
        return JSONResponse(
            {"error": "a turn is already running or queued in this conversation "
                      "(queue mode 'reject'); try again when it has finished"},
            status_code=409,
        )
    if accepted.new:
        metrics.count_run_accepted(key.channel)
        await request.app.state.hooks.acall("message_received", {
            "run_id": accepted.run_id, "channel": key.channel, "chatId": key.chat_id,
            "threadScope": key.thread_scope, "text": body.message,
        })
    if accepted.code is AcceptCode.queued:
        celery = request.app.state.celery
        try:
            await anyio.to_thread.run_sync(lambda: celery.send_task(DISPATCH_TASK, args=[conv]))
        except Exception:
            # The message is already durable in the inbox; the reaper dispatches it.
            log.exception("could not enqueue dispatch for %s", conv)
    return JSONResponse(
        {"runId": accepted.run_id, "acceptedAt": ms(msg.accepted_at),
         "duplicate": accepted.code is AcceptCode.duplicate},
        status_code=202,
    )


@router.get("/runs/{run_id}")
async def get_run(run_id: str, request: Request) -> dict[str, Any]:
    return run_json(await _record(request, run_id))


# After a lifecycle error, how long ``wait`` gives the run to start again (Fased: transient
# errors get a short grace so a retry can emit a new start).
WAIT_ERROR_GRACE_SECONDS = 3.0


@router.get("/runs/{run_id}/wait")
async def wait_run(
    run_id: str,
    request: Request,
    timeout: float = Query(30.0, ge=0, le=MAX_WAIT_SECONDS, description="seconds"),
) -> dict[str, Any]:
    """Block until the run ends (lifecycle end/error) or ``timeout`` seconds pass."""
    r = request.app.state.redis
    rec = await _record(request, run_id)
    deadline = time.monotonic() + timeout
    if rec.status.terminal:
        return wait_json(rec, timed_out=False)
    grace_until: float | None = None
    async for ev in events.follow(r, run_id, block_ms=250):
        if ev is not None and ev.terminal:
            return wait_json(await _record(request, run_id), timed_out=False)
        if ev is not None and ev.stream == "lifecycle":
            # A transient error starts the grace; a new start ends it.
            grace_until = (
                time.monotonic() + WAIT_ERROR_GRACE_SECONDS if ev.data.get("phase") == "error" else None
            )
        now_ = time.monotonic()
        if grace_until is not None and now_ >= grace_until:
            rec = await _record(request, run_id)
            if rec.status.terminal:
                return wait_json(rec, timed_out=False)
            grace_until = None
        if now_ >= deadline:
            break
    return wait_json(await _record(request, run_id), timed_out=True)


async def _sse(request: Request, run_id: str, after: str) -> AsyncIterator[str]:
    async for ev in events.follow(request.app.state.redis, run_id, after=after, block_ms=1000):
        if await request.is_disconnected():
            return
        if ev is None:
            yield ": keepalive\n\n"
            continue
        yield f"id: {ev.id}\nevent: {ev.stream}\ndata: {json.dumps(ev.data)}\n\n"
        if ev.terminal:
            return


@router.get("/runs/{run_id}/events")
async def run_events(run_id: str, request: Request) -> StreamingResponse:
    """SSE of the run's events, replayed from the start (or after ``Last-Event-ID``)."""
    await _record(request, run_id)
    after = request.headers.get("last-event-id") or "0"
    return StreamingResponse(
        _sse(request, run_id, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
