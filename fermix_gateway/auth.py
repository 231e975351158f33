"""Who may talk to Fermix: the bearer token for ``/v1/*`` (required when ``FERMIX_API_TOKEN``
is set), and on the chat channels the trust of a sender (``FERMIX_OWNER_IDS``,
``FERMIX_ALLOWED_IDS``)."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

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


async def require_token(request: Request) -> None:
    """A coroutine on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
    thread hop per request (and under a burst, dozens of threads fighting the event loop for
    the GIL); this one does no I/O."""
    token = request.app.state.settings.api_token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise HTTPException(
            401, "missing bearer token (Authorization: Bearer <FERMIX_API_TOKEN>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})
