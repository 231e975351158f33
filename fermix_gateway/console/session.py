"""Signing in and out of the console.

``POST /console/login`` takes a token (``FERMIX_API_TOKEN`` or a named one) from the sign-in
form, checks it as the API does, and opens a session (fermix_shared/access/sessions.py): the
browser gets only its id, in the cookie ``fermix_session`` (HttpOnly, SameSite=Strict, Secure
over HTTPS, for 12 hours). A wrong token is the form again with a reason (401), audited as a
``check`` (``console.login``), as is each sign-in. ``POST /console/logout`` (with the CSRF
token) ends the session. Without ``FERMIX_API_TOKEN`` (development) an empty token signs in as
the admin.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from fermix_gateway.auth import SESSION_COOKIE, caller_of, same_origin
from fermix_gateway.console.render import HEADERS, page, signed_in
from fermix_shared import audit
from fermix_shared.access import sessions, tokens

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/login")
async def login_form(request: Request) -> Response:
    if await signed_in(request) is not None:
        return RedirectResponse("/console", status_code=303, headers=HEADERS)
    return page(request, "login.html", None, error="")


async def _open(request: Request, given: str) -> tuple[str, sessions.Session] | None:
    """A session for the token ``given``, or None when it is no token of this gateway."""
    r, env = request.app.state.redis, request.app.state.settings.api_token
    env_secret = env.get_secret_value() if env is not None else None
    if (env_secret is not None and given and hmac.compare_digest(given.encode(), env_secret.encode())) \
            or (env_secret is None and not given):
        return await sessions.open_async(r, tokens.ENV_TOKEN_NAME, "admin",
                                         sessions.ENV_PREFIX + tokens.digest(env_secret or ""))
    token = await tokens.lookup_async(r, given)
    if token is None:
        return None
    return await sessions.open_async(r, token.name, token.role, tokens.digest(given))


@router.post("/login")
async def login(request: Request) -> Response:
    r = request.app.state.redis
    if not same_origin(request):
        return page(request, "login.html", None, status=403,
                    error="This sign-in came from another site.")
    form = await request.form()
    given = str(form.get("token") or "").strip()
    opened = await _open(request, given)
    if opened is None:
        await audit.arecord(r, "check", "console.login", "fail", actor="http:console")
        return page(request, "login.html", None, status=401,
                    error="That token is not valid here (or it was revoked).")
    sid, session = opened
    await audit.arecord(r, "check", "console.login", "pass", actor=f"http:{session.name}",
                        role=session.role)
    resp = RedirectResponse("/console", status_code=303, headers=HEADERS)
    resp.set_cookie(SESSION_COOKIE, sid, max_age=sessions.SESSION_TTL_S, httponly=True,
                    samesite="strict", path="/",
                    # Behind a TLS proxy the request may look like http: the configured URL says.
                    secure=request.url.scheme == "https"
                    or request.app.state.settings.gateway_url.startswith("https://"))
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    await caller_of(request)  # a live session, and its CSRF token with the request
    sid = request.cookies.get(SESSION_COOKIE, "")
    await sessions.close_async(request.app.state.redis, sid)
    resp = RedirectResponse("/console/login", status_code=303, headers=HEADERS)
    resp.delete_cookie(SESSION_COOKIE, path="/")
    return resp

