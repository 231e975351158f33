"""Console sessions: signing in with a token opens one, kept in Redis for
:data:`SESSION_TTL_S` (fleet-wide: any gateway serves it), and the browser holds only its id
in an HttpOnly, SameSite=Strict cookie (fermix_gateway/console/session.py).

A session acts as the token it was opened with and ends with it: reading a session checks
that its named token still exists (a revoked token's sessions stop at once) or, for
``FERMIX_API_TOKEN``, that the gateway's token is still the one signed in with. Each session
has its own CSRF token, which every state-changing request made with the cookie must send
back (``X-CSRF-Token``). Only the SHA-256 of a session id is a key, as for tokens.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.access.tokens import Role, check_role, digest

SESSION_TTL_S = 12 * 3600
# What a session opened with FERMIX_API_TOKEN records as its token: this prefix and the
# environment token's digest.
ENV_PREFIX = "env:"


@dataclass(frozen=True)
class Session:
    """Who signed in (the token's name and role), with which token (its digest; for the
    environment token :data:`ENV_PREFIX` + its digest), and the session's CSRF token."""

    name: str
    role: Role
    token: str
    csrf: str


def _key(sid: str) -> str:
    return keys.console_session(hashlib.sha256(sid.encode()).hexdigest())


async def open_async(r: aioredis.Redis, name: str, role: Role, token: str) -> tuple[str, Session]:
    """A new session of the token ``token`` (digest) named ``name``: its id and itself."""
    sid = secrets.token_urlsafe(32)
    session = Session(name, role, token, secrets.token_urlsafe(32))
    await r.set(_key(sid), json.dumps(asdict(session)), ex=SESSION_TTL_S)
    return sid, session


async def read_async(r: aioredis.Redis, sid: str, env_token: str | None) -> Session | None:
    """The live session ``sid``, or None: unknown, expired, or its token revoked or replaced
    (``env_token``: the gateway's FERMIX_API_TOKEN, or None: an open gateway, whose admin
    signs in with an empty token)."""
    raw = await r.get(_key(sid)) if sid else None
    if not raw:
        return None
    d = json.loads(raw)
    session = Session(d["name"], check_role(d["role"]), d["token"], d["csrf"])
    if session.token.startswith(ENV_PREFIX):
        if session.token != ENV_PREFIX + digest(env_token or ""):
            return None
    elif not await r.hexists(keys.api_tokens(), session.token):
        return None
    return session


async def close_async(r: aioredis.Redis, sid: str) -> None:
    """End the session ``sid`` (signing out)."""
    await r.delete(_key(sid))
