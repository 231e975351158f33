"""Rendering a console page: the template with the signed-in caller and the session's CSRF
token, and the headers every console response carries (no framing, no referrer to elsewhere, nothing
loaded from elsewhere, no inline script)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from fermix_gateway.auth import SESSION_COOKIE, Caller, caller_of
from fermix_gateway.console import HERE

TEMPLATES = Jinja2Templates(directory=HERE / "templates")
TEMPLATES.env.filters["datetime_utc"] = lambda ms: datetime.fromtimestamp(
    int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def page(request: Request, template: str, caller: Caller | None, status: int = 200,
         **context: Any) -> HTMLResponse:
    session = getattr(request.state, "session", None)
    return TEMPLATES.TemplateResponse(
        request, template, {"caller": caller, "csrf": session.csrf if session else "",
                            **context}, status_code=status, headers=HEADERS)


async def signed_in(request: Request) -> Caller | None:
    """The console session's caller, or None (no session, or it ended)."""
    if not request.cookies.get(SESSION_COOKIE):
        return None
    try:
        return await caller_of(request)
    except HTTPException:  # an ended session is a sign-in page, not an error
        return None


def to_login() -> RedirectResponse:
    return RedirectResponse("/console/login", status_code=303, headers=HEADERS)
