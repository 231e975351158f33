"""Who may talk to Fermix: the bearer token of ``/v1/*`` and its role (required when
``FERMIX_API_TOKEN`` is set; named tokens: fermix_shared/access/tokens.py), and on the chat
channels the trust of a sender (``FERMIX_OWNER_IDS``, ``FERMIX_ALLOWED_IDS``).

Every route depends on :data:`require_token` (any role reads); a route that changes something
depends on :func:`need` with the role it takes, and audits the change with the caller's
:attr:`Caller.actor`: ``operator`` to send messages, answer approvals, pause and resume
agents; ``admin`` for budgets, kills and tokens."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request

from fermix_shared import audit
from fermix_shared.access import sessions, tokens
from fermix_shared.access.tokens import Role
from fermix_shared.models import Trust
from fermix_shared.settings import Settings


def trust_of(settings: Settings, channel: str, user_id: str) -> Trust | None:
    """Owners are operators, allowed users guests, anyone else None (to be dropped)."""
    who = f"{channel}:{user_id}"
    if who in settings.owner_ids:
        return "operator"
    if who in settings.allowed_ids:
        return "guest"
    return None


@dataclass(frozen=True)
class Caller:
    """Who made an API request: the token's name (``api`` for ``FERMIX_API_TOKEN``, and for
    anyone when no token is configured) and its role."""

    name: str
    role: Role

    @property
    def actor(self) -> str:
        """The audit trail's actor: ``http:<token name>``."""
        return f"http:{self.name}"


ENV_CALLER = Caller(tokens.ENV_TOKEN_NAME, "admin")
# The console's session cookie (fermix_gateway/console/session.py) and its CSRF header.
SESSION_COOKIE = "fermix_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


async def caller_of(request: Request) -> Caller:
    """The request's caller, from its bearer token or its console session cookie (resolved
    once per request; fermix_shared/access/sessions.py). Without
    ``FERMIX_API_TOKEN`` the API is open (development): no token means the admin, a named
    token still means its own role. A coroutine on purpose: FastAPI runs a plain ``def``
    dependency in its thread pool, a thread hop per request; the environment token is checked
    with no I/O, a named one with one Redis read."""
    found: Caller | None = getattr(request.state, "caller", None)
    if found is not None:
        return found
    env = request.app.state.settings.api_token
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if not header and (sid := request.cookies.get(SESSION_COOKIE)):
        found = await _session_caller(request, sid)
    elif scheme.lower() != "bearer" or not given:
        if env is not None:
            raise _unauthorized("missing bearer token (Authorization: Bearer <FERMIX_API_TOKEN>)")
        _open_mode_guard(request)
        found = ENV_CALLER
    elif env is not None and hmac.compare_digest(given.encode(), env.get_secret_value().encode()):
        found = ENV_CALLER
    elif (token := await tokens.lookup_async(request.app.state.redis, given)) is not None:
        found = Caller(token.name, token.role)
    elif env is None:
        found = ENV_CALLER
    else:
        raise _unauthorized("invalid bearer token")
    request.state.caller = found
    return found


async def _session_caller(request: Request, sid: str) -> Caller:
    """The console session's caller; a state-changing request must carry the session's CSRF
    token (``X-CSRF-Token``) and, when the browser says where it comes from, this origin."""
    env = request.app.state.settings.api_token
    session = await sessions.read_async(request.app.state.redis, sid,
                                        env.get_secret_value() if env else None)
    if session is None:
        raise _unauthorized("the console session has ended: sign in again")
    if request.method not in SAFE_METHODS:
        given = request.headers.get(CSRF_HEADER, "")
        if not given or not hmac.compare_digest(given.encode(), session.csrf.encode()):
            raise HTTPException(403, f"missing or wrong CSRF token ({CSRF_HEADER})")
        if not same_origin(request):
            raise HTTPException(403, "a request from another origin")
    request.state.session = session
    return Caller(session.name, session.role)


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def _host_name(host: str) -> str:
    """``Host``'s name without its port (``[::1]:8080`` -> ``[::1]``)."""
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _open_mode_guard(request: Request) -> None:
    """With no ``FERMIX_API_TOKEN`` the API is open to whoever reaches it, which must not
    include a web page in the operator's browser: a request a browser made (it says so with
    ``Origin`` or ``Sec-Fetch-*``) must be addressed to a loopback name or to the configured
    ``gateway_url`` (a DNS-rebinding page addresses its own name), and one that changes
    something must come from this origin (a cross-site form or fetch does not). Scripts and
    SDKs send neither header and are unaffected."""
    headers = request.headers
    if "origin" not in headers and "sec-fetch-mode" not in headers and \
            "sec-fetch-site" not in headers:
        return
    host = _host_name(headers.get("host", "").lower())
    configured = _host_name(urlsplit(request.app.state.settings.gateway_url).netloc.lower())
    if host not in LOOPBACK_HOSTS and not host.endswith(".localhost") and host != configured:
        raise HTTPException(403, f"the API has no token (FERMIX_API_TOKEN) and answers a "
                                 f"browser only on a loopback address or {configured}, "
                                 f"not {host or 'an empty Host'}")
    if request.method not in SAFE_METHODS and (
            not same_origin(request) or headers.get("sec-fetch-site") == "cross-site"):
        raise HTTPException(403, "a request from another origin (the API has no token, "
                                 "so only its own pages and scripts may change things)")


def same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (when the browser sent one) is this gateway's own."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def need(role: Role) -> Callable[[Request], Awaitable[Caller]]:
    """A dependency: the caller, when its role allows ``role``; else a 403 naming the role
    needed (and an audit ``check`` entry, ``role``)."""

    async def check(request: Request) -> Caller:
        caller = await caller_of(request)
        if tokens.allows(caller.role, role):
            return caller
        await audit.arecord(request.app.state.redis, "check", "role", "fail",
                            actor=caller.actor, route=f"{request.method} {request.url.path}",
                            role=caller.role, needs=role)
        raise HTTPException(403, f"this needs the {role} role; the token {caller.name!r} is "
                                 f"{'an' if caller.role[0] in 'aeiou' else 'a'} {caller.role}")

    return check


# Every /v1 router's dependency: a valid token of any role (reads are for viewers).
require_token = need("viewer")
# A route's caller, when it may act (``who: Operator``) or change the fleet (``who: Admin``).
Operator = Annotated[Caller, Depends(need("operator"))]
Admin = Annotated[Caller, Depends(need("admin"))]
