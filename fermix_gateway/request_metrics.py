"""RequestLatency: every answered request into ``fermix_http_request_seconds``, by method, route
template and status class, timed from the request's arrival to the end of its response (a
streamed one included), so a scrape shows which routes are slow (issue 32).

The outermost middleware: a body refused as too large and an error turned into a 500 are
timed too. The route is the template the router matched (``scope["route"]``), never the path.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fermix_shared import metrics


class RequestLatency:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 500  # no response started: counted a 5xx

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics.observe_request(scope["method"], route, status,
                                    time.perf_counter() - started)
