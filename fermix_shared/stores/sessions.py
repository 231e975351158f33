"""A conversation's session: from its first message to the ``/new`` that ends it.

The Fased hook points ``session_start`` and ``session_end`` are its boundaries. A session
begins with the first turn of a conversation that has none (its very first message, or the
first after ``/new``, ``/reset`` or ``/clear``): the worker starting that turn marks it with a
fresh id (one SET NX, so of two racing starts one begins it) and calls ``session_start``.
``/new`` (and its aliases) ends it: the gateway takes the id away and calls ``session_end``;
a conversation that never had a message has no session to end.
"""

from __future__ import annotations

import uuid

import redis
import redis.asyncio as aioredis

from fermix_shared import keys


def begin(r: redis.Redis, conv: str) -> str | None:
    """A new session's id when ``conv`` had none (this turn starts it), else None."""
    session_id = new_id()
    return session_id if r.set(keys.session(conv), session_id, nx=True) else None


def new_id() -> str:
    """A session id, as :func:`begin` sets it (``SET keys.session(conv) id NX``)."""
    return "ses_" + uuid.uuid4().hex


async def end_async(r: aioredis.Redis, conv: str) -> str | None:
    """End ``conv``'s session: its id, or None when it had none."""
    ended = await r.getdel(keys.session(conv))
    return ended.decode() if isinstance(ended, bytes) else ended
