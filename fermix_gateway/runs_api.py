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

from fermix_gateway.auth import require_token
from fermix_gateway.schemas import AgentRequest, ms, run_json, wait_json
from fermix_shared.celery_app import DISPATCH_TASK
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord
from fermix_shared.stores import events, queue, runs

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])

MAX_WAIT_SECONDS = 3600.0


async def _record(request: Request, run_id: str) -> RunRecord:
    rec = await runs.get_async(request.app.state.redis, run_id)
    if rec is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return rec


@router.post("/agent", status_code=202)
async def start_run(body: AgentRequest, request: Request) -> JSONResponse:
    """Accept a message: durable in the conversation's inbox before we answer."""
    key = ConversationKey(channel="http", chat_id=str(body.chatId), thread_scope=body.threadScope or "root")
    msg = InboundMessage(key=key, text=body.message, profile=body.profile, trust="operator")
    accepted = await queue.accept_async(
        request.app.state.redis, msg, dedupe_scope=key.as_str(), message_id=body.messageId
    )
    if accepted.new:
        celery = request.app.state.celery
        try:
            await anyio.to_thread.run_sync(
                lambda: celery.send_task(DISPATCH_TASK, args=[key.as_str()])
            )
        except Exception:
            # The message is already durable in the inbox; the next dispatch for this
            # conversation (or recovery) picks it up.
            log.exception("could not enqueue dispatch for %s", key.as_str())
    return JSONResponse(
        {"runId": accepted.run_id, "acceptedAt": ms(msg.accepted_at), "duplicate": not accepted.new},
        status_code=202,
    )


@router.get("/runs/{run_id}")
async def get_run(run_id: str, request: Request) -> dict[str, Any]:
    return run_json(await _record(request, run_id))


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
    async for ev in events.follow(r, run_id, block_ms=500):
        if ev is not None and ev.terminal:
            return wait_json(await _record(request, run_id), timed_out=False)
        if time.monotonic() >= deadline:
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
