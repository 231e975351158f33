"""HTTP server speaking the OpenAI and Anthropic wire formats, driven by a :class:`Script`.

Endpoints: ``POST /v1/chat/completions`` (also ``/chat/completions``), ``POST /v1/messages``,
``POST /v1/embeddings`` (deterministic vectors; a queued ``Fail`` whose ``match`` is in an
input fails it), and control endpoints ``POST /_scripted/push`` (JSON list of entries), ``POST /_scripted/reset``,
``GET /_scripted/requests``.

A reply without scripted usage reports the prompt as measured against the scripted prompt
caches (:mod:`.prompt_cache`: Anthropic's ``cache_control`` breakpoints, OpenAI's automatic
prefix caching), the completion estimated at 4 characters a token.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from types import FrameType, ModuleType, TracebackType
from typing import Any, Self

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import anthropic_wire, embeddings_wire, openai_wire
from ._connection import Drop, ScriptedApp, emit, pause
from .prompt_cache import PromptTokens, TooManyBreakpoints
from .script import (
    Disconnect,
    Fail,
    Hang,
    Reply,
    RequestView,
    Script,
    Usage,
    default_reply,
    entries_from_json,
    estimate_usage,
)

_HEADER_KEYS = {
    "content-type", "user-agent", "anthropic-version", "anthropic-beta", "idempotency-key",
    "openai-organization", "openai-project",
}  # fmt: skip
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def create_app(script: Script, *, closing: threading.Event | None = None) -> Starlette:
    """Build the ASGI app serving both providers from ``script``.

    ``closing`` (set by :meth:`ScriptedLLMServer.stop`) cuts pending delays/hangs short.
    """
    closing = closing or threading.Event()
    app = ScriptedApp(routes=[*_provider_routes(script, closing), *_control_routes(script)])
    app.state.script = script
    app.state.closing = closing
    return app


def _provider_routes(script: Script, closing: threading.Event) -> list[Route]:
    """The model endpoints, one per wire format (OpenAI's also without the ``/v1`` prefix)."""

    async def openai_endpoint(request: Request) -> Response:
        return await _answer(request, openai_wire, script, closing)

    async def anthropic_endpoint(request: Request) -> Response:
        return await _answer(request, anthropic_wire, script, closing)

    async def embeddings_endpoint(request: Request) -> Response:
        return await _embed(request, script)

    return [
        Route("/v1/chat/completions", openai_endpoint, methods=["POST"]),
        Route("/chat/completions", openai_endpoint, methods=["POST"]),
        Route("/v1/messages", anthropic_endpoint, methods=["POST"]),
        Route("/v1/embeddings", embeddings_endpoint, methods=["POST"]),
        Route("/embeddings", embeddings_endpoint, methods=["POST"]),
    ]


def _control_routes(script: Script) -> list[Route]:
    """The endpoints a test drives the script through: queue entries, reset, read requests."""

    async def push(request: Request) -> Response:
        try:
            entries = entries_from_json(await request.json())
        except (ValueError, ValidationError, KeyError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        script.push(*entries)
        return JSONResponse({"pending": len(script)})

    async def reset(request: Request) -> Response:
        script.reset()
        return JSONResponse({"pending": 0})

    async def requests_(request: Request) -> Response:
        return JSONResponse(script.requests)

    return [
        Route("/_scripted/push", push, methods=["POST"]),
        Route("/_scripted/reset", reset, methods=["POST"]),
        Route("/_scripted/requests", requests_, methods=["GET"]),
    ]


async def _answer(
    request: Request, wire: ModuleType, script: Script, closing: threading.Event
) -> Response:
    """One model call: take the script's next entry for its last user message (the default
    reply when none is queued), record the request, and serve the entry in ``wire``'s format."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        status, err, headers = wire.error_response(Fail(400, "body must be a JSON object"))
        return JSONResponse(err, status_code=status, headers=headers)
    view = wire.parse_request(body)
    entry = script.next_for(view.last_user_text)
    script.record(
        {
            "provider": wire.PROVIDER,
            "path": request.url.path,
            "body": body,
            "headers": {
                k: v
                for k, v in request.headers.items()
                if k in _HEADER_KEYS or k.startswith("x-stainless-")
            },
            "entry": entry.kind if entry is not None else "default",
        }
    )
    entry = entry or default_reply(view)
    if isinstance(entry, Reply):
        try:
            prompt = script.prompt_cache.account(wire.PROVIDER, body)
        except TooManyBreakpoints as e:
            entry = Fail(400, str(e))
        else:
            entry = entry if entry.usage is not None else _measured(entry, prompt)
    if isinstance(entry, Fail):
        status, err, headers = wire.error_response(entry)
        return JSONResponse(err, status_code=status, headers=headers)

    def hung_up() -> None:
        script.note_hangup(view.last_user_text)

    return await _serve(request, wire, entry, body, view, closing, hung_up)


def _measured(reply: Reply, prompt: PromptTokens) -> Reply:
    """``reply`` with the usage the scripted model reports when the script gave none: the
    prompt as measured against the cache (prompt_cache.py), the completion estimated."""
    out = estimate_usage(reply, None).output_tokens
    return replace(reply, usage=Usage(prompt.total, out, cache_read=prompt.cache_read,
                                      cache_write=prompt.cache_write))


async def _embed(request: Request, script: Script) -> Response:
    """One embeddings call, recorded (``entry``: ``embeddings`` or ``fail``)."""
    try:
        body = await request.json()
        texts = embeddings_wire.inputs_of(body if isinstance(body, dict) else {})
    except ValueError as exc:
        status, err, headers = openai_wire.error_response(Fail(400, str(exc)))
        return JSONResponse(err, status_code=status, headers=headers)
    failure = script.failure_for("\n".join(texts))
    script.record({"provider": "openai", "path": request.url.path, "body": body, "headers": {},
                   "entry": "fail" if failure else "embeddings"})
    if failure is not None:
        status, err, headers = openai_wire.error_response(failure)
        return JSONResponse(err, status_code=status, headers=headers)
    return JSONResponse(embeddings_wire.render_response(body, texts))


async def _serve(
    request: Request, wire: ModuleType, entry: Reply | Hang | Disconnect, body: dict[str, Any],
    view: RequestView, closing: threading.Event, hung_up: Callable[[], None],
) -> Response:
    """Serve a non-failing entry: hang or drop the connection, or reply, streamed when the
    request asked for a stream."""
    stream = body.get("stream") is True
    if isinstance(entry, Hang) or (isinstance(entry, Disconnect) and not stream):
        return Drop(entry.seconds if isinstance(entry, Hang) else 0.0, closing, hung_up)
    if isinstance(entry, Disconnect):
        events = wire.stream_events(Reply(text=entry.text), body, view)[: entry.after_chunks]
        return StreamingResponse(
            emit(events, 0.0, request.scope),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )
    assert isinstance(entry, Reply)
    if not await pause(entry.delay, request.receive, closing):
        hung_up()
        return Drop(0.0, closing)
    if not stream:
        return JSONResponse(wire.render_response(entry, body, view))
    events = wire.stream_events(entry, body, view)
    return StreamingResponse(
        emit(events, entry.chunk_delay, None),
        media_type="text/event-stream",
        headers=_SSE_HEADERS,
    )


class _Uvicorn(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self._on_started()


class ScriptedLLMServer:
    """Runs :func:`create_app` under uvicorn on a socket bound up front (``port=0`` = free port).

    ``start()`` serves from a background thread and returns once accepting connections;
    ``stop()`` shuts down. Usable as a context manager.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        script: Script | None = None,
        *,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.port = port
        self.script = script if script is not None else Script()
        self.log_level = log_level
        self._closing = threading.Event()
        self.app = create_app(self.script, closing=self._closing)
        self._started = threading.Event()
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (the real port once bound)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    def _prepare(self, on_started: Callable[[], None]) -> tuple[_Uvicorn, socket.socket]:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, http="h11", loop="asyncio", ws="none", lifespan="off", interface="asgi3",
            log_config=None, log_level=self.log_level, access_log=False,
            timeout_graceful_shutdown=2,
        )  # fmt: skip
        self._closing.clear()
        self._server = _Uvicorn(config, on_started)
        return self._server, sock

    def start(self, timeout: float = 10.0) -> Self:
        """Serve from a daemon thread; block until uvicorn accepts connections."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._started.clear()
        server, sock = self._prepare(self._started.set)

        def run() -> None:
            try:
                server.run(sockets=[sock])
            finally:
                self._started.set()  # unblock start() if startup failed
                sock.close()

        self._thread = threading.Thread(target=run, name="scripted-llm", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout) or not server.started:
            self.stop()
            raise RuntimeError("scripted LLM server failed to start")
        return self

    def serve_forever(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve in the current thread (handles SIGINT/SIGTERM) until shut down."""
        server, sock = self._prepare(on_ready or (lambda: None))
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Shut down: cut pending hangs/delays short, stop uvicorn, join the thread."""
        self._closing.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m fermix_dev.scripted_llm [--host H] [--port P] [--script FILE.json]``."""
    parser = argparse.ArgumentParser(description="Scripted OpenAI/Anthropic-compatible LLM server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", help="JSON file with a list of entries to preload")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    server = ScriptedLLMServer(args.host, args.port, log_level=args.log_level)
    if args.script:
        with open(args.script, encoding="utf-8") as fh:
            server.script.push(*entries_from_json(json.load(fh)))

    def ready() -> None:
        print(f"scripted LLM listening on {server.url}", flush=True)

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # uvicorn re-raises SIGTERM after its graceful shutdown

    signal.signal(signal.SIGTERM, terminate)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(on_ready=ready)
    return 0
