"""A cap on request bodies, enforced before a body is read whole.

:class:`BodyLimit` is pure ASGI middleware around the app. When a route reads its body, a
declared ``Content-Length`` over the cap is refused before the first byte is taken, and a body
without one (chunked) is counted as it streams in: the read that crosses the cap raises
:class:`BodyTooLarge`, which the app answers 413 with a reason. A route that never reads its
body (a webhook refused by its secret header) answers as it would anyway. Uvicorn discards what
the client still sends after the answer, so the connection is not reset under it.

(Starlette and FastAPI grew a ``max_body_size`` of their own in versions newer than the ones we
support; this one also gives our ``{"error": ...}`` shape and names the setting.)
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fermix_shared.errors import UserInputError

SETTING = "FERMIX_LIMITS__MAX_BODY_BYTES"


class BodyTooLarge(UserInputError, HTTPException):
    """A request body over the cap: 413. An HTTPException, so FastAPI's own body parsing lets
    it through unchanged (any other error there becomes a 400); a UserInputError too, since
    the caller sent it."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than {limit} bytes ({SETTING})")


def too_large_response(exc: BodyTooLarge) -> JSONResponse:
    return JSONResponse({"error": exc.detail}, status_code=413)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        taken = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal taken
            if declared is not None and declared > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            message = await receive()
            if message["type"] == "http.request":
                taken += len(message.get("body", b""))
                if taken > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge as exc:
            # The app normally answers it itself; this is for a read outside a route.
            if started:
                raise
            await too_large_response(exc)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length", "")
    if not (value.isascii() and value.isdigit()):
        return None
    return int(value) if len(value) <= 18 else 10**18
