"""The gateway: a thin FastAPI app. It verifies, de-duplicates, stores and enqueues; it never
calls a model. Run it with ``fermix gateway`` (uvicorn, factory ``create_app``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fermix_gateway import api
from fermix_gateway.body_limit import BodyLimit, BodyTooLarge, too_large_response
from fermix_gateway.publisher import TaskPublisher
from fermix_gateway.request_metrics import RequestLatency
from fermix_gateway.webhooks import slack as slack_webhooks
from fermix_gateway.webhooks import telegram as telegram_webhook
from fermix_shared import metrics, tracing
from fermix_shared.celery_app import make_celery
from fermix_shared.hooks import HookRegistry, get_hooks
from fermix_shared.redis.client import async_client_for_settings
from fermix_shared.redis.durability import NOT_REPLICATED_RETRY_AFTER_S, AcceptWait, NotReplicated
from fermix_shared.redis.replicas import wait_rule
from fermix_shared.settings import Settings, get_settings
from fermix_shared.stores import fleet

log = logging.getLogger(__name__)


def _text(value: object) -> str:
    """``value`` as text that can be encoded: a field name or message may echo the client's
    lone surrogates, which would make the 422 itself fail as a 500."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(errors: list[Any]) -> str:
    parts = []
    for e in errors:
        loc = ".".join(_text(x) for x in e.get("loc", ()) if x not in ("body", "query", "path"))
        parts.append(f"{loc or 'body'}: {_text(e.get('msg', 'invalid'))}")
    return "; ".join(parts)


async def _beat(r: Any, stop: asyncio.Event) -> None:
    """This gateway's heartbeat for the console's Fleet view, every few seconds until
    ``stop`` is set; a failed beat is only logged (the next one tries again)."""
    name, started = f"{socket.gethostname()}:{os.getpid()}", time.time()
    while not stop.is_set():
        try:
            await fleet.gateway_beat_async(r, name, started)
        except Exception as e:  # noqa: BLE001 - the view's data, never the gateway's health
            log.debug("gateway heartbeat not written: %s", e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), fleet.GATEWAY_BEAT_S)


async def _stop_beat(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    """End the heartbeat before the Redis client closes: asked, then cancelled if a beat
    hangs (a beat never outlives the app, whatever Redis does)."""
    stop.set()
    try:
        await asyncio.wait_for(task, 2.0)
    except (TimeoutError, asyncio.CancelledError):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def create_app(settings: Settings | None = None, hooks: HookRegistry | None = None) -> FastAPI:
    """The gateway app; ``hooks`` defaults to the plugins installed (``fermix.hooks``)."""
    settings = settings or get_settings()
    hooks = hooks if hooks is not None else get_hooks()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # OTEL_* asks for traces (checked once per process; off, nothing is set up).
        tracing.setup("fermix-gateway", f"{socket.gethostname()}:{os.getpid()}")
        app.state.redis = async_client_for_settings(settings)
        # Tests may set their own (recording) sender before start-up.
        publisher = None
        if getattr(app.state, "tasks", None) is None:
            publisher = app.state.tasks = TaskPublisher(app.state.celery)
        await hooks.acall("gateway_start", {"gateway_url": settings.gateway_url})
        stop_beat = asyncio.Event()
        beating = asyncio.create_task(_beat(app.state.redis, stop_beat))
        try:
            yield
        finally:
            await _stop_beat(beating, stop_beat)
            await hooks.acall("gateway_stop", {"gateway_url": settings.gateway_url})
            if publisher is not None:
                await anyio.to_thread.run_sync(publisher.close)
                app.state.tasks = None
            await app.state.redis.aclose()
            await anyio.to_thread.run_sync(tracing.flush)

    app = FastAPI(title="Fermix gateway", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.celery = make_celery(settings)
    # The durability wait at accept (FERMIX_REDIS_WAIT_REPLICAS), one per process.
    app.state.accept_wait = AcceptWait(wait_rule(settings), settings.redis_wait_timeout_ms)
    app.state.hooks = hooks
    app.add_middleware(BodyLimit, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(RequestLatency)  # outermost: a refused body is timed too
    for router in api.routers():
        app.include_router(router)
    # Webhooks authenticate by the platform's secret or signature, not the API token.
    app.include_router(telegram_webhook.router)
    app.include_router(slack_webhooks.router)
    if settings.console:
        from fermix_gateway import console

        console.install(app)

    _install_error_handlers(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        await app.state.redis.ping()
        if wait_rule(settings).replicas == 0:
            return {"status": "ok"}
        # Still ok without a replica under auto (accepting): the detail says it is unreplicated.
        replicas = await app.state.accept_wait.status(app.state.redis)
        return {"status": "ok", "detail": {"redis.replicas": replicas}}

    # No auth, like /healthz: operators keep it off the public internet (proxy or firewall).
    @app.get("/metrics", include_in_schema=False)
    async def metrics_route() -> Response:
        fleet = await metrics.render_fleet(app.state.redis)
        return Response(metrics.render() + fleet, media_type=metrics.CONTENT_TYPE)

    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Every error the gateway answers itself: a clear 4xx or 503 with a reason, never a 500."""
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _describe(list(exc.errors()))}, status_code=422)

    # One error shape on every route but the OpenAI-compatible ones (they answer in OpenAI's):
    # {"error": "<reason>"}, FastAPI's {"detail": ...} included (404, 401, 405...).
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code in (204, 304):
            return Response(status_code=exc.status_code, headers=exc.headers)
        return JSONResponse({"error": _text(exc.detail)}, status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return too_large_response(exc)

    # An accepted message not yet on enough replicas: the platform retries after a moment and
    # its retry, a duplicate, gets the normal answer (fermix_shared/redis/durability.py).
    @app.exception_handler(NotReplicated)
    async def _not_replicated(request: Request, exc: NotReplicated) -> JSONResponse:
        return JSONResponse({"error": "storage not replicated, try again"}, status_code=503,
                            headers={"Retry-After": str(NOT_REPLICATED_RETRY_AFTER_S)})

    @app.exception_handler(RedisError)
    async def _store_down(request: Request, exc: RedisError) -> JSONResponse:
        log.error("redis unavailable: %s", exc)
        return JSONResponse({"error": "storage unavailable, try again"}, status_code=503)


# The log level `fermix gateway` was started with, for the app factory of each process.
LOG_LEVEL_ENV = "FERMIX_GATEWAY_LOG_LEVEL"


def serve_app() -> FastAPI:
    """The factory ``fermix gateway`` gives uvicorn. With ``--processes N`` uvicorn starts N
    fresh processes, each calling this: each installs Fermix's log handler (format, secret
    masking, turn context) before it builds the app."""
    from fermix_shared import logs

    settings = get_settings()
    logs.configure(os.environ.get(LOG_LEVEL_ENV, "INFO"), settings)
    app = create_app(settings)
    # Everything imported so far lives as long as the process: out of the collector's sight,
    # so a full collection under load walks only what requests made (a 100-200 ms pause
    # otherwise, in the middle of acks).
    gc.collect()
    gc.freeze()
    return app
