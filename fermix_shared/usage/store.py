"""Usage in Redis: every model call counted once, atomically, in each scope it is charged to,
in this hour's, day's and month's bucket (UTC); and the reads behind ``fermix usage``,
``GET /v1/usage``, ``/usage`` and the budgets.

One bucket is one hash (``keys.usage``) whose fields are ``<metric>:<scope>``: a call is one
Lua script (``usage_record.lua``: a few HINCRBYs per scope and period, the buckets' expiry,
and the release of the call's budget reservation), costs are integers (micro-dollars), so concurrent calls on any number of workers add
up exactly. Reads are one pipeline of HMGETs (a scope over some buckets) or one HGETALL (every
scope of a bucket).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from typing import Any

import redis
import redis.asyncio as aioredis

from fermix_shared import keys, lua
from fermix_shared.usage.periods import PERIODS, Period, bucket_id, expire_at
from fermix_shared.usage.scopes import ScopeKind, scope_kind

# In the order of Totals' fields. ``in`` is every input token (cached ones included), of
# which ``cread`` and ``cwrite`` were read from and written to the prompt cache; ``out``
# includes ``reason``, the reasoning tokens.
METRICS = ("in", "out", "calls", "usd", "unpriced", "cread", "cwrite", "reason")


@dataclass(frozen=True)
class Totals:
    """Usage summed over calls: tokens, calls, micro-dollars, calls without a price, and the
    parts of the tokens: ``input_tokens`` includes the cache's reads and writes,
    ``output_tokens`` the reasoning tokens."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    usd_micros: int = 0
    unpriced_calls: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Totals) -> Totals:
        return Totals(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def as_json(self) -> dict[str, Any]:
        return {"inputTokens": self.input_tokens, "outputTokens": self.output_tokens,
                "tokens": self.tokens, "calls": self.calls, "usd": self.usd_micros / 1e6,
                "usdMicros": self.usd_micros, "unpricedCalls": self.unpriced_calls,
                "cacheReadTokens": self.cache_read_tokens,
                "cacheWriteTokens": self.cache_write_tokens,
                "reasoningTokens": self.reasoning_tokens}

    @classmethod
    def from_json(cls, j: dict[str, Any]) -> Totals:
        """The totals of :meth:`as_json` (the parts 0 from a gateway that sends none)."""
        return cls(j["inputTokens"], j["outputTokens"], j["calls"], j["usdMicros"],
                   j["unpricedCalls"], j.get("cacheReadTokens", 0),
                   j.get("cacheWriteTokens", 0), j.get("reasoningTokens", 0))


@dataclass(frozen=True)
class BucketRef:
    """One scope in one bucket."""

    scope: str
    period: Period
    when: datetime | float

    @property
    def key(self) -> str:
        return keys.usage(self.period, bucket_id(self.period, self.when))

    @property
    def fields(self) -> list[str]:
        return [f"{m}:{self.scope}" for m in METRICS]


def _int(v: Any) -> int:
    return int(v) if v not in (None, "") else 0


def _totals(values: Sequence[Any]) -> Totals:
    return Totals(*(_int(v) for v in values))


def record(r: redis.Redis, scopes: Sequence[str], input_tokens: int, output_tokens: int,
           usd_micros: int, unpriced_model: str, when: float, reservation: str = "", *,
           count: bool = True, cache_read: int = 0, cache_write: int = 0,
           reasoning: int = 0) -> int:
    """Count one call (its tokens, cost, and the model if it had no price) in ``scopes``, in
    the hour, day and month of ``when`` (unix time), and release its ``reservation``
    (fermix_shared/usage/reserve.py) and any that lapsed by ``when``, in one script.
    ``input_tokens`` includes the ``cache_read`` and ``cache_write`` ones, ``output_tokens``
    the ``reasoning`` ones (:class:`~fermix_shared.usage.prices.CallTokens`).
    ``count=False`` releases only (a call that failed). Returns the reservations released
    (0 on a pipeline, where it is queued)."""
    out = lua.USAGE_RECORD(
        r, **{p: keys.usage(p, bucket_id(p, when)) for p in PERIODS},
        unpriced=keys.usage_unpriced(), reserved=keys.usage_reserved(),
        reservations=keys.usage_reservations(), expiry=keys.usage_reservation_expiry(),
        rate=keys.usage_rate(),
        input_tokens=max(0, input_tokens), output_tokens=max(0, output_tokens),
        usd_micros=max(0, usd_micros), unpriced_model=unpriced_model,
        **{f"{p}_expire_at": expire_at(p, when) for p in PERIODS},
        reservation_id=reservation, now=when, count="1" if count else "0",
        cache_read=max(0, cache_read), cache_write=max(0, cache_write),
        reasoning=max(0, reasoning), scopes=list(scopes),
    )
    # On a pipeline the script is queued: its count comes back with the pipeline's results.
    return 0 if isinstance(r, redis.client.Pipeline) else int(out)


def totals(r: redis.Redis, refs: Sequence[BucketRef]) -> list[Totals]:
    """Each ref's totals, in one round trip."""
    pipe = r.pipeline(transaction=False)
    for ref in refs:
        pipe.hmget(ref.key, ref.fields)
    return [_totals(v) for v in pipe.execute()] if refs else []


async def totals_async(r: aioredis.Redis, refs: Sequence[BucketRef]) -> list[Totals]:
    """Gateway side of :func:`totals`."""
    if not refs:
        return []
    pipe = r.pipeline(transaction=False)
    for ref in refs:
        pipe.hmget(ref.key, ref.fields)
    return [_totals(v) for v in await pipe.execute()]


def split_bucket(raw: dict[Any, Any], kind: ScopeKind | None = None) -> dict[str, Totals]:
    """A bucket's hash as scope -> totals (only scopes of ``kind`` when given)."""
    acc: dict[str, list[int]] = {}
    for field, value in raw.items():
        metric, sep, scope = str(field).partition(":")
        if not sep or metric not in METRICS:
            continue
        try:
            if kind is not None and scope_kind(scope) != kind:
                continue
        except ValueError:
            continue
        acc.setdefault(scope, [0] * len(METRICS))[METRICS.index(metric)] = _int(value)
    return {scope: Totals(*values) for scope, values in sorted(acc.items())}


async def bucket_scopes_async(r: aioredis.Redis, period: Period, when: datetime | float,
                              kind: ScopeKind | None = None) -> dict[str, Totals]:
    """Every scope (of ``kind``) with usage in the bucket of ``when``."""
    return split_bucket(await r.hgetall(keys.usage(period, bucket_id(period, when))), kind)


def bucket_scopes(r: redis.Redis, period: Period, when: datetime | float,
                  kind: ScopeKind | None = None) -> dict[str, Totals]:
    """Worker/CLI side of :func:`bucket_scopes_async`."""
    raw: dict[Any, Any] = r.hgetall(keys.usage(period, bucket_id(period, when)))
    return split_bucket(raw, kind)


async def unpriced_models_async(r: aioredis.Redis) -> dict[str, int]:
    """Models counted without a price, with their calls (all time)."""
    return {str(k): _int(v) for k, v in (await r.hgetall(keys.usage_unpriced())).items()}


def refs_for(scopes: Iterable[str], periods: Iterable[Period], when: datetime | float
             ) -> list[BucketRef]:
    """Every (scope, period) pair's current bucket."""
    return [BucketRef(s, p, when) for s in scopes for p in periods]
