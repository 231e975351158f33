"""Reservations: a model call's worst case held against every budget before it is made.

Before each model call the caller reserves its worst case (the prompt as sent, estimated, plus
``max_tokens``, priced) against every budget of the scopes it is charged to, fleet-wide and
atomically (``usage_reserve.lua``): each budget must have room for what its scope spent, what
live reservations hold and this call. A call that does not fit is not made
(:class:`Refused` names the budget). After the call the reservation is released in the same
script that records the provider-reported usage (:func:`fermix_shared.usage.store.record`); a
call that failed releases it alone. A caller that dies before either leaves its reservation
to lapse after ``hold_s``: every record releases lapsed ones, and a refusal releases them and
tries again.

So concurrent turns on any number of workers cannot together outrun a budget by more than
the estimate's error: twenty calls racing for a budget that fits five make five.

The same script holds the call against its agent's tokens per minute when it has a limit
(:mod:`fermix_shared.usage.rate`; :class:`~fermix_shared.usage.rate.RateLimited` when it does
not fit), and the record settles that too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from fermix_shared import keys, lua
from fermix_shared.usage.periods import PERIODS, Period, bucket_id
from fermix_shared.usage.rate import RateLimited, TokenRate, frees_at, minute_of
from fermix_shared.usage.store import record


@dataclass(frozen=True)
class Reserved:
    """The call may go ahead; ``id`` settles it."""

    id: str


@dataclass(frozen=True)
class Refused:
    """The budget on ``scope`` for ``period`` has no room for the call."""

    scope: str
    period: Period


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


Got = Reserved | Refused | RateLimited


def _reserve(r: redis.Redis, rid: str, scopes: Sequence[str], usd_micros: int, tokens: int,
             now: float, hold_s: float, rate: TokenRate | None) -> Got:
    buckets = {p: bucket_id(p, now) for p in PERIODS}
    res = lua.USAGE_RESERVE(
        r, **{p: keys.usage(p, b) for p, b in buckets.items()},
        budgets=keys.budgets(), reserved=keys.usage_reserved(),
        reservations=keys.usage_reservations(), expiry=keys.usage_reservation_expiry(),
        rate=keys.usage_rate(),
        reservation_id=rid, usd_micros=max(0, usd_micros), tokens=max(0, tokens),
        expires_at=now + hold_s, **{f"{p}_bucket": b for p, b in buckets.items()},
        rate_agent=rate.agent if rate else "", rate_limit=rate.per_minute if rate else 0,
        minute=minute_of(now), scopes=list(scopes),
    )
    if int(res[0]) == 1:
        return Reserved(rid)
    if int(res[0]) == 2 and rate is not None:
        return RateLimited(rate, int(res[1]), frees_at(now))
    period = _text(res[2])
    if period not in PERIODS:
        raise ValueError(f"usage_reserve refused with an unknown period {period!r}")
    return Refused(_text(res[1]), period)


def reserve(r: redis.Redis, scopes: Sequence[str], usd_micros: int, tokens: int, now: float,
            hold_s: float, rate: TokenRate | None = None) -> Got:
    """Reserve a call's worst case (``usd_micros``, ``tokens``) in ``scopes``' budgets and
    its agent's ``rate``: one script. Refused by a budget, lapsed reservations are released
    (they may hold the room) and the call tried once more."""
    rid = uuid.uuid4().hex
    got = _reserve(r, rid, scopes, usd_micros, tokens, now, hold_s, rate)
    if isinstance(got, Refused) and release(r, "", now):
        got = _reserve(r, rid, scopes, usd_micros, tokens, now, hold_s, rate)
    return got


def release(r: redis.Redis, reservation_id: str, now: float) -> int:
    """Give a reservation back without counting usage (the call failed; "" for none), and
    the lapsed ones; returns how many were released."""
    return record(r, [], 0, 0, 0, "", now, reservation_id, count=False)
