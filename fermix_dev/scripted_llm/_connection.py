"""Connection-level helpers: pauses that notice disconnects, and abrupt connection drops."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

TRANSPORT_KEY = "fermix.scripted_llm.transport"


# Not a FermixError: the scripted model server stands in for a provider's network, and this is its
# order to uvicorn to drop a connection. Fermix code never sees it (the client sees only the
# dropped connection), so it has no place in the tree of what Fermix raises.
class ScriptedConnectionDrop(Exception):
    """Raised to make the ASGI server drop a connection when the transport is not reachable."""


class ScriptedApp(Starlette):
    """Starlette app that exposes the uvicorn transport to handlers, so they can drop it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[TRANSPORT_KEY] = getattr(getattr(send, "__self__", None), "transport", None)
        await super().__call__(scope, receive, send)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def pause(seconds: float, receive: Receive, closing: threading.Event) -> bool:
    """Sleep up to ``seconds``; False if the client went away or the server is closing first."""
    if seconds <= 0:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        while not closing.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return True
            done, _ = await asyncio.wait({watcher}, timeout=min(remaining, 0.05))
            if done:
                return False
        return False
    finally:
        watcher.cancel()


def close_transport(scope: Scope) -> None:
    transport = scope.get(TRANSPORT_KEY)
    if transport is None:
        raise ScriptedConnectionDrop("scripted disconnect")
    transport.close()


class Drop(Response):
    """Send nothing (after an optional wait), then close the connection without a response.
    ``on_hangup`` is called when the client closes the connection first."""

    def __init__(
        self, seconds: float, closing: threading.Event,
        on_hangup: Callable[[], None] = lambda: None,
    ) -> None:
        self.seconds = seconds
        self.closing = closing
        self.on_hangup = on_hangup
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await pause(self.seconds, receive, self.closing) and not self.closing.is_set():
            self.on_hangup()
            return  # client already gone
        close_transport(scope)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_wait_disconnect(receive), 2.0)


async def emit(
    events: list[str], chunk_delay: float, drop_scope: Scope | None
) -> AsyncIterator[str]:
    for i, event in enumerate(events):
        if i and chunk_delay > 0:
            await asyncio.sleep(chunk_delay)
        yield event
    if drop_scope is not None:
        close_transport(drop_scope)
        await asyncio.sleep(5.0)  # cancelled by Starlette once the disconnect is noticed
        raise ScriptedConnectionDrop("scripted disconnect")
