"""The OpenAI-compatible API: ``GET /v1/models`` and ``POST /v1/chat/completions``, so that any
OpenAI client or chat UI (``base_url = <gateway>/v1``, the API token as its key) talks to a
Fermix agent.

A model is an agent: ``fermix/<agent>`` (a bare ``<agent>`` is accepted too), one for every
agent that answers conversations (``role = "main"``; ``sub`` agents run only inside other
agents' turns and are not listed).

A completion is one turn of the agent, taken exactly as ``POST /v1/agent`` takes a message
(:func:`fermix_gateway.api.runs.start_message`): the bearer-token holder is an operator, the
conversation's queue mode applies, ``/commands`` are answered as commands (their reply is the
completion's content), a paused agent's message waits in its conversation until the agent
resumes. The conversation is an ``http`` chat: the ``x-fermix-chat`` header, else the ``user``
field, names it (the same chat as ``chatId`` on ``POST /v1/agent``); with neither, each request
is a fresh conversation. Responses carry ``x-fermix-run-id`` and ``x-fermix-chat`` (the chat id
percent-encoded as UTF-8, :func:`~fermix_gateway.api.openai_schemas.chat_header`: a header is
Latin-1 on the wire; a request's ``x-fermix-chat`` is decoded the same way).

A retry never runs a message twice: an ``Idempotency-Key`` header makes a request's message
that key (``messageId`` on ``POST /v1/agent``), so its retry waits for the same run; and every
5xx answered once the message may be stored carries ``x-should-retry: false``.

History is the conversation's own, kept by Fermix: only the **last** ``user`` message of
``messages`` is the turn's input; earlier messages (and any system prompt) are ignored.

Not streamed: the answer comes when the run ends (at most ``MAX_WAIT_SECONDS``). ``usage`` is
the run's token count as its last checkpoint recorded it (zeros for a command, or once the
checkpoint has expired). A run that ends ``error`` is a 502 and one that ends ``stopped`` a
409; a run still going at the bound is a 504; each names the run, whose outcome
``GET /v1/runs/{id}`` still shows, and carries ``x-should-retry: false`` (the message was
accepted: an SDK retry would run it again).

Streamed: ``chat.completion.chunk`` events as the run's ``assistant`` deltas arrive (a first
chunk with the role, the content deltas, a last chunk with ``finish_reason: "stop"``, then
``data: [DONE]``); a reply that was not streamed (a command, a merged message) comes as one
delta at the end. ``stream_options.include_usage`` is honoured (a last chunk with empty
``choices`` and the usage). A run that ends ``error`` or ``stopped`` ends the stream with an
``{"error": ...}`` event, which OpenAI's SDKs raise as an ``APIError``.

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``: a bad request is
a 400, an unknown model a 404 (``model_not_found``), a missing or wrong token a 401.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from redis.exceptions import RedisError

from fermix_gateway.api.openai_schemas import (
    CHUNKS,
    BadRequest,
    ChatCompletion,
    ChatCompletionRequest,
    Model,
    ModelList,
    OpenAIError,
    OpenAIRoute,
    agent_of_model,
    chat_header,
    chat_of_header,
    chat_of_idempotency_key,
    check_chat_id,
    error_body,
    error_response,
    last_user_text,
    model_id,
)
from fermix_gateway.api.runs import (
    MAX_WAIT_SECONDS,
    Refused,
    Started,
    agent_problem,
    start_message,
    wait_for_end,
)
from fermix_gateway.api.wire import ErrorBody, refusals, v1_router
from fermix_gateway.auth import Operator
from fermix_gateway.bodies import is_id
from fermix_shared import keys
from fermix_shared.agents.definitions import agent_names
from fermix_shared.models import ConversationKey, RunStatus
from fermix_shared.redis.durability import NOT_REPLICATED_RETRY_AFTER_S
from fermix_shared.settings import Settings
from fermix_shared.stores import events

log = logging.getLogger(__name__)
# Models have no creation date of their own; they are as old as this gateway process.
_STARTED = int(time.time())
_NO_RETRY = {"x-should-retry": "false"}


router = v1_router(OpenAIRoute)


def _answering_agents(settings: Settings) -> list[str]:
    return [name for name in agent_names(settings.agents) if agent_problem(settings, name) is None]


def _model_json(agent: str) -> dict[str, Any]:
    return {"id": model_id(agent), "object": "model", "created": _STARTED, "owned_by": "fermix"}


def _unknown_model(model: str, settings: Settings) -> JSONResponse:
    known = ", ".join(model_id(a) for a in _answering_agents(settings))
    return error_response(404, f"The model {model!r} does not exist; models: {known}",
                          type_="invalid_request_error", param="model", code="model_not_found")


@router.get("/models", response_model=ModelList)
async def list_models(request: Request) -> dict[str, Any]:
    """One model per agent that answers conversations, ``fermix/<agent>``."""
    settings: Settings = request.app.state.settings
    return {"object": "list", "data": [_model_json(a) for a in _answering_agents(settings)]}


# A model id with a line break matches no route (the path parameter stops at it): the app's
# own 404, ``{"error": "Not Found"}``, answers it.
@router.get("/models/{model:path}", response_model=Model,
            responses=refusals({404: "No agent answers as that model (`model_not_found`)."},
                               OpenAIError | ErrorBody))
async def get_model(model: str, request: Request) -> dict[str, Any] | JSONResponse:
    settings: Settings = request.app.state.settings
    agent = agent_of_model(model)
    if agent_problem(settings, agent) is not None:
        return _unknown_model(model, settings)
    return _model_json(agent)


async def _usage(request: Request, run_id: str) -> dict[str, int]:
    """The run's tokens from its last checkpoint (the worker's ``LoopState.usage``); zeros
    when it has none."""
    raw = await request.app.state.redis.get(keys.run_state(run_id))
    try:
        usage = json.loads(raw)["usage"]
        prompt, completion = int(usage["input_tokens"]), int(usage["output_tokens"])
    except (TypeError, ValueError, KeyError):
        prompt = completion = 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _failure(run_id: str, status: str, error: str | None) -> tuple[int, dict[str, Any]]:
    """A run that ended without an answer: its HTTP status and OpenAI error body."""
    if status == RunStatus.stopped:
        return 409, error_body(
            f"run {run_id} was stopped before it answered (/stop, an interrupting message, "
            "or its agent's queue was cleared)", "run_error", code="run_stopped")
    return 502, error_body(f"run {run_id} ended in error: {error or 'unknown error'}",
                           "run_error", code="run_failed")


def _refusal(out: Refused) -> JSONResponse:
    headers = None if out.retry_after is None else {"Retry-After": str(out.retry_after)}
    status = 400 if out.status == 422 else out.status
    param = "messages" if status == 400 else None
    return error_response(status, out.reason, param=param, headers=headers)


@router.post("/chat/completions", response_model=ChatCompletion, responses={
    200: {"description": "The completion, or with `stream: true` its chunks.", "content": CHUNKS},
    **refusals({
        404: "No agent answers as that model (`model_not_found`).",
        409: "The run was stopped (`run_stopped`), or the conversation is busy in queue mode "
             "`reject`.",
        429: "The conversation's queue is full, or the chat is over its rate (`Retry-After`).",
        500: "The message could not be accepted cleanly, or its answer not sent "
             "(`internal_error`, `x-should-retry: false`).",
        502: "The run ended in error (`run_failed`).",
        504: "The run did not end within an hour (`run_timeout`).",
    }, OpenAIError)})
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    who: Operator,
    # Percent-encoded UTF-8 (200 characters of up to 4 bytes, 3 characters a byte).
    x_fermix_chat: str | None = Header(default=None, max_length=2400),
    idempotency_key: str | None = Header(default=None, max_length=200),
) -> Response:
    """One turn of the agent ``model`` names (see the module docstring: only the last user
    message is read; the conversation's history is Fermix's own)."""
    settings: Settings = request.app.state.settings
    agent = agent_of_model(body.model)
    if agent_problem(settings, agent) is not None:
        return _unknown_model(body.model, settings)
    try:
        if idempotency_key is not None and not is_id(idempotency_key):
            raise BadRequest("Idempotency-Key: 1-200 characters without whitespace or '|'",
                             "Idempotency-Key")
        if x_fermix_chat is not None:
            chat = chat_of_header(x_fermix_chat)
        elif body.user is not None:
            chat = check_chat_id(body.user, "user")
        elif idempotency_key is not None:
            chat = chat_of_idempotency_key(idempotency_key)
        else:
            chat = f"openai-{uuid.uuid4().hex}"
        text = last_user_text(body.messages)
    except BadRequest as e:
        return error_response(400, str(e), param=e.param)
    key = ConversationKey(channel="http", chat_id=chat, thread_scope="root")
    message_id = f"openai:{idempotency_key}" if idempotency_key is not None else None
    try:
        out = await start_message(request, key, text, agent=agent, message_id=message_id,
                                  caller=who)
    except RedisError as e:
        return _store_failure(e, retry_safe=message_id is not None)
    except Exception:
        # Perhaps after the message was stored (a hook failing, say): a retry could run it
        # twice, so none unless the Idempotency-Key makes it a duplicate.
        log.exception("accepting a completion failed")
        return error_response(500, "the message could not be accepted cleanly and may run; "
                                   "GET /v1/status shows what runs", code="internal_error",
                              headers=None if message_id is not None else _NO_RETRY)
    if isinstance(out, Refused):
        return _refusal(out)
    try:
        return await _answer(request, body, out, model_id(agent), chat)
    except Exception:
        # Accepted, then failed: a retry would run the message again (unless it is a
        # duplicate), so the SDK is told not to.
        log.exception("completion of run %s failed after it was accepted", out.run_id)
        return error_response(
            500, f"run {out.run_id} was accepted but its answer could not be sent; "
                 f"GET /v1/runs/{out.run_id} shows how it ends", code="internal_error",
            headers={"x-fermix-run-id": out.run_id, **_NO_RETRY})


def _store_failure(e: RedisError, *, retry_safe: bool) -> JSONResponse:
    """Redis failed while the message was being accepted: it may be stored (a write not yet
    on a replica is). Without an ``Idempotency-Key`` a retry could run it twice: not retried."""
    log.error("redis failed while accepting a completion: %s", e)
    if retry_safe:
        return error_response(503, "storage unavailable, try again (the Idempotency-Key "
                                   "makes the retry safe)", type_="server_error",
                              headers={"Retry-After": str(NOT_REPLICATED_RETRY_AFTER_S)})
    return error_response(
        503, "storage failed while the message was being accepted, so it may run; not "
             "retried, as a retry could run it twice (send an Idempotency-Key header to make "
             "retries safe)", type_="server_error", code="storage_unavailable",
        headers=_NO_RETRY)


async def _answer(request: Request, body: ChatCompletionRequest, out: Started, model: str,
                  chat: str) -> Response:
    headers = {"x-fermix-run-id": out.run_id, "x-fermix-chat": chat_header(chat)}
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _chunks(request, out, model, include_usage), media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    rec, timed_out = await wait_for_end(request, out.run_id, MAX_WAIT_SECONDS)
    if timed_out:
        return error_response(
            504, f"run {out.run_id} did not end within {MAX_WAIT_SECONDS:g} s; it goes on "
                 f"(GET /v1/runs/{out.run_id} shows how it ends)",
            type_="run_error", code="run_timeout", headers={**headers, **_NO_RETRY})
    if rec.status is not RunStatus.ok:
        status, err = _failure(out.run_id, rec.status, rec.error)
        return JSONResponse(err, status_code=status, headers={**headers, **_NO_RETRY})
    return JSONResponse({
        "id": f"chatcmpl-{out.run_id}",
        "object": "chat.completion",
        "created": int(out.accepted_at),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": rec.reply or ""},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": await _usage(request, out.run_id),
    }, headers=headers)


def _unstreamed(reply: str, streamed: str) -> str:
    """What of the final reply the deltas did not carry: all of it when none came (a command,
    a merged message), the tail when they were its beginning, else nothing."""
    if not streamed:
        return reply
    return reply[len(streamed):] if reply.startswith(streamed) else ""


async def _chunks(request: Request, started: Started, model: str,
                  include_usage: bool) -> AsyncIterator[str]:
    run_id = started.run_id
    base = {"id": f"chatcmpl-{run_id}", "object": "chat.completion.chunk",
            "created": int(started.accepted_at), "model": model}

    def chunk(delta: dict[str, str], finish: str | None = None) -> str:
        out: dict[str, Any] = {**base, "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = None
        return f"data: {json.dumps(out)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    streamed = ""
    async for ev in events.follow(request.app.state.redis, run_id, block_ms=1000):
        if ev is None:
            if await request.is_disconnected():
                return
            yield ": keepalive\n\n"
            continue
        if ev.stream == "assistant" and (delta := str(ev.data.get("delta") or "")):
            streamed += delta
            yield chunk({"content": delta})
        if not ev.terminal:
            continue
        if ev.data.get("phase") == "end" and ev.data.get("status") == RunStatus.ok:
            if rest := _unstreamed(str(ev.data.get("reply") or ""), streamed):
                yield chunk({"content": rest})
            yield chunk({}, "stop")
            if include_usage:
                usage = await _usage(request, run_id)
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        else:
            status = RunStatus.error if ev.data.get("phase") == "error" else ev.data.get("status")
            _, err = _failure(run_id, str(status), ev.data.get("error"))
            yield f"data: {json.dumps(err)}\n\n"
        return
