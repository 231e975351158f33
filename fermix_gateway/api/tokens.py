"""Named API tokens, for admins: ``GET /v1/tokens`` lists them (name, role, when and by whom
made, the secret's last 4 characters), ``POST /v1/tokens`` ``{"name", "role"}`` makes one and
answers 201 with its ``token``, shown this once (only its hash is kept), ``DELETE
/v1/tokens/{name}`` revokes one at once on every gateway. A bad name or role, a name taken or
unknown: 422, 409, 404 with the reason. Each change is an audit entry (``admin``,
``token.create`` / ``token.revoke``) naming the admin's token.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from fermix_gateway.api.admin_bodies import NewToken, TokenRevoked, Tokens
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Admin
from fermix_shared import audit
from fermix_shared.access import tokens
from fermix_shared.access.tokens import TokenRefused

router = v1_router()


class TokenBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    role: str = Field(max_length=16)


@router.get("/tokens", response_model=Tokens)
async def list_tokens(request: Request, who: Admin) -> dict[str, Any]:
    found = await tokens.list_async(request.app.state.redis)
    return {"tokens": [t.as_json() for t in found]}


@router.post("/tokens", status_code=201, response_model=NewToken, responses=refusals({
    409: "A token of that name exists.", 422: "A bad name or role (the reason says why)."}))
async def create_token(body: TokenBody, request: Request, who: Admin) -> dict[str, Any]:
    r = request.app.state.redis
    try:
        tokens.check_name(body.name)
        tokens.check_role(body.role)
        token, secret = await tokens.create_async(r, body.name, body.role, who.name)
    except TokenRefused as e:
        raise HTTPException(e.status, str(e)) from e
    await audit.arecord(r, "admin", "token.create", "ok", actor=who.actor, token=token.name,
                        role=token.role)
    return {**token.as_json(), "token": secret}


@router.delete("/tokens/{name}", response_model=TokenRevoked,
               responses=refusals({404: "No token of that name."}))
async def revoke_token(name: str, request: Request, who: Admin) -> dict[str, Any]:
    r = request.app.state.redis
    try:
        token = await tokens.revoke_async(r, name)
    except TokenRefused as e:
        raise HTTPException(e.status, str(e)) from e
    await audit.arecord(r, "admin", "token.revoke", "ok", actor=who.actor, token=token.name,
                        role=token.role)
    return {"revoked": token.as_json()}
