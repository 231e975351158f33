"""Named API tokens with roles, stored hashed in Redis, fleet-wide.

Three roles, each allowing what the one below it does:

* ``viewer``: read (every ``GET`` of ``/v1``);
* ``operator``: also act on conversations: send messages, answer approvals, stop a turn,
  pause and resume an agent, run a job now;
* ``admin``: also change the fleet: budgets, kill an agent, reload skills, manage tokens.

``FERMIX_API_TOKEN`` stays an admin token, named :data:`ENV_TOKEN_NAME`; the others are made
by :func:`create` (``fermix tokens create --name ann --role operator``), which returns the
secret once: only its SHA-256 is kept, so a token that is lost is revoked and made anew. A
secret is ``fxt_`` and 43 URL-safe characters (256 random bits): hashing it without a salt is
safe, and it lets a request be resolved with one read (:func:`lookup_async`). A revoked token
stops working on every gateway at once (the next request reads the store).

Keys (``fermix_shared/keys.py``): ``api_tokens`` (hash SHA-256 -> the token's JSON) and
``api_token_names`` (hash name -> SHA-256), changed together in one transaction.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Literal, get_args

import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.errors import UserInputError

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
# The name FERMIX_API_TOKEN goes by in the audit trail and in 403s: ``http:api``, as before
# named tokens existed.
ENV_TOKEN_NAME = "api"
SECRET_PREFIX = "fxt_"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def allows(have: Role, need: Role) -> bool:
    """Whether a token of role ``have`` may do what needs ``need``."""
    return ROLES.index(have) >= ROLES.index(need)


class TokenRefused(UserInputError):
    """A token cannot be created or revoked as asked: ``status`` is the HTTP answer (422 a bad
    name or role, 409 a name taken, 404 no such token)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ApiToken:
    """A named token: its role, when and by whom it was made, and the secret's last 4
    characters (to tell tokens apart in a list; the secret itself is never stored)."""

    name: str
    role: Role
    created_at: float
    created_by: str
    hint: str

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "role": self.role, "createdAt": int(self.created_at * 1000),
                "createdBy": self.created_by, "hint": f"…{self.hint}"}


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_name(name: str) -> str:
    """``name`` as a token name: 1-64 of a-z 0-9 . _ -, starting with a letter or digit, and
    not the environment token's."""
    if not _NAME.match(name):
        raise TokenRefused(f"a token name is 1-64 of a-z 0-9 . _ - (starting with a letter "
                           f"or digit), not {name!r}")
    if name == ENV_TOKEN_NAME:
        raise TokenRefused(f"{ENV_TOKEN_NAME!r} is FERMIX_API_TOKEN's name: choose another")
    return name


def check_role(role: str) -> Role:
    for known in ROLES:
        if role == known:
            return known
    raise TokenRefused(f"a role is one of {', '.join(ROLES)}, not {role!r}")


def _parse(raw: str | bytes) -> ApiToken:
    d = json.loads(raw)
    return ApiToken(name=d["name"], role=check_role(d["role"]), created_at=d["created_at"],
                    created_by=d["created_by"], hint=d["hint"])


async def create_async(r: aioredis.Redis, name: str, role: str, by: str,
                       now: float | None = None) -> tuple[ApiToken, str]:
    """Make a token; returns it and its secret (shown once). :class:`TokenRefused` when the
    name is taken or the name or role is not valid."""
    token = ApiToken(check_name(name), check_role(role), time.time() if now is None else now,
                     by, "")
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(**{**asdict(token), "hint": secret[-4:]})
    sha = digest(secret)
    async with r.pipeline(transaction=True) as pipe:
        await pipe.watch(keys.api_token_names())
        if await pipe.hexists(keys.api_token_names(), name):
            raise TokenRefused(f"a token named {name!r} exists: revoke it first", 409)
        pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        pipe.hset(keys.api_token_names(), name, sha)
        pipe.hset(keys.api_tokens(), sha, json.dumps(asdict(token)))
        await pipe.execute()
    return token, secret


async def revoke_async(r: aioredis.Redis, name: str) -> ApiToken:
    """Revoke the token ``name`` (it stops working at once); :class:`TokenRefused` when no
    token has that name."""
    async with r.pipeline(transaction=True) as pipe:
        await pipe.watch(keys.api_token_names())
        sha = await pipe.hget(keys.api_token_names(), name)
        raw = await pipe.hget(keys.api_tokens(), sha) if sha else None
        if not sha or not raw:
            raise TokenRefused(f"no token is named {name!r}", 404)
        pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        pipe.hdel(keys.api_token_names(), name)
        pipe.hdel(keys.api_tokens(), sha)
        await pipe.execute()
    return _parse(raw)


async def list_async(r: aioredis.Redis) -> list[ApiToken]:
    """Every token, by name."""
    found = [_parse(v) for v in (await r.hgetall(keys.api_tokens())).values()]
    return sorted(found, key=lambda t: t.name)


async def lookup_async(r: aioredis.Redis, secret: str) -> ApiToken | None:
    """The token whose secret is ``secret``, or None."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    raw = await r.hget(keys.api_tokens(), digest(secret))
    return _parse(raw) if raw else None
