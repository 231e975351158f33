"""Usage and budgets for operators: ``GET /v1/usage``, ``GET|PUT|DELETE /v1/budgets``.

``GET /v1/usage`` reads what every model call cost (fermix_shared/usage/):

* ``scope`` (default ``total``): ``agent:NAME``, ``conversation:CHANNEL:CHAT`` (or
  ``channel|chat|thread``), ``user:CHANNEL:ID``; or a kind (``agent``, ``conversation``,
  ``user``) for every scope of it with usage in the current ``period`` (default ``day``),
  costliest first;
* without ``by``: the scope's current hour, day and month (only ``period`` when given) and its
  budgets;
* ``by`` (``hour``, ``day``, ``month``): a series of buckets, newest first: the ``last`` N
  (default 24 hours, 30 days, 12 months), or those of the current ``period`` when given
  (``period=month&by=day``: this month's days);
* ``by=kind``: every call fleet-wide split by what made it (``turn``, ``scheduled``,
  ``subagent``, ``skill``, ``compaction``, ``memory_review``), in the current hour, day and
  month (only ``period`` when given); for the total only (the kinds are fleet-wide tallies).

Times are ms since the epoch, buckets UTC; ``usd`` is a number of dollars, ``usdMicros`` the
exact integer behind it; ``unpricedCalls`` are calls of models without a price (counted $0,
their models by name with their calls in ``unpricedModels``). ``inputTokens`` counts every
input token, of which ``cacheReadTokens`` and ``cacheWriteTokens`` were read from and written
to the provider's prompt cache (priced at its rates); ``outputTokens`` includes
``reasoningTokens``.

``PUT /v1/budgets`` ``{"scope", "period", "usd"?, "tokens"?}`` sets a limit (replacing the
scope's one for that period) and answers with its state; ``DELETE
/v1/budgets?scope=&period=`` removes it (404 when there is none); ``GET /v1/budgets`` lists
every budget against its spending (as ``/v1/status``'s ``budgets``).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Literal

from fastapi import HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from fermix_gateway.api.usage_bodies import BudgetRemoved, Budgets, BudgetState, Usage
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Admin
from fermix_shared import audit
from fermix_shared.usage import budgets, store
from fermix_shared.usage.budgets import Budget
from fermix_shared.usage.periods import (
    ADJECTIVE,
    MAX_BUCKETS,
    PERIODS,
    Period,
    bucket_id,
    next_start,
    recent,
    start_of,
)
from fermix_shared.usage.scopes import CALL_KINDS, SCOPE_KINDS, TOTAL, kind_scope, parse_scope
from fermix_shared.usage.store import BucketRef, Totals

router = v1_router()

DEFAULT_LAST: dict[Period, int] = {"hour": 24, "day": 30, "month": 12}
_ORDER = {p: i for i, p in enumerate(PERIODS)}


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def bucket_json(period: Period, start: datetime, totals: Totals) -> dict[str, Any]:
    return {"bucket": bucket_id(period, start), "start": _ms(start), **totals.as_json()}


def _scope(text: str) -> str:
    try:
        return parse_scope(text)
    except ValueError as e:
        raise HTTPException(422, f"scope: {e}") from None


def series_starts(by: Period, period: Period | None, when: float, last: int | None
                  ) -> list[datetime]:
    """The bucket starts of a series, newest first (see the module docstring)."""
    if last is None and period is not None:
        if _ORDER[by] > _ORDER[period]:
            raise HTTPException(422, f"by: a {by} is longer than the period ({period})")
        begin = start_of(period, when)
        starts = recent(by, when, MAX_BUCKETS[by] + 1)
        return [s for s in starts if s >= begin][: MAX_BUCKETS[by]]
    count = last or DEFAULT_LAST[by]
    if count > MAX_BUCKETS[by]:
        raise HTTPException(422, f"last: at most {MAX_BUCKETS[by]} {by}s are kept")
    return recent(by, when, count)


async def _by_kind(r: Any, periods: tuple[Period, ...], when: float) -> dict[str, Any]:
    refs = [BucketRef(kind_scope(k), p, when) for p in periods for k in CALL_KINDS]
    found = iter(await store.totals_async(r, refs))
    return {"scope": TOTAL, "by": "kind", "periods": {
        p: {"bucket": bucket_id(p, when), "start": _ms(start_of(p, when)),
            "resetsAt": _ms(next_start(p, when)),
            "kinds": [{"kind": k, **next(found).as_json()} for k in CALL_KINDS]}
        for p in periods}}


@router.get("/usage", response_model=Usage)
async def get_usage(
    request: Request,
    scope: str = TOTAL,
    period: Period | None = None,
    by: Period | Literal["kind"] | None = None,
    last: int | None = Query(default=None, ge=1),
) -> dict[str, Any]:
    r = request.app.state.redis
    when = time.time()
    if by == "kind":
        if scope != TOTAL:
            raise HTTPException(422, "by: kinds are counted fleet-wide, for scope=total only")
        return await _by_kind(r, (period,) if period else PERIODS, when)
    if scope in SCOPE_KINDS and scope != TOTAL:
        if by is not None:
            raise HTTPException(422, "by: a series is for one scope, not every "
                                     f"{scope} (scope={scope}:...)")
        p: Period = period or "day"
        found = await store.bucket_scopes_async(r, p, when, scope)
        ranked = sorted(found.items(), key=lambda kv: (-kv[1].usd_micros, -kv[1].tokens, kv[0]))
        return {"kind": scope, "period": p, "bucket": bucket_id(p, when),
                "start": _ms(start_of(p, when)), "resetsAt": _ms(next_start(p, when)),
                "scopes": [{"scope": s, **t.as_json()} for s, t in ranked]}
    exact = _scope(scope)
    statuses = await budgets.statuses_async(r, [exact], when)
    out: dict[str, Any] = {"scope": exact, "budgets": budgets.budgets_json(statuses),
                           "unpricedModels": await store.unpriced_models_async(r)}
    if by is not None:
        starts = series_starts(by, period, when, last)
        series = await store.totals_async(r, [BucketRef(exact, by, s) for s in starts])
        out.update(by=by, buckets=[bucket_json(by, s, t)
                                   for s, t in zip(starts, series, strict=True)])
        return out
    periods: tuple[Period, ...] = (period,) if period else PERIODS
    current = await store.totals_async(r, [BucketRef(exact, p, when) for p in periods])
    out["periods"] = {
        p: {**bucket_json(p, start_of(p, when), t), "resetsAt": _ms(next_start(p, when))}
        for p, t in zip(periods, current, strict=True)
    }
    return out


# The largest limits taken: a billion dollars, a quadrillion tokens. Both stay exact in
# Redis's 64-bit counters (as micro-dollars: 10^15) with room for what is spent beyond them.
MAX_USD = 1_000_000_000
MAX_TOKENS = 10**15


class BudgetBody(BaseModel):
    """``PUT /v1/budgets``. Strict: ``"5"`` is no amount and ``true`` no token count."""

    model_config = ConfigDict(extra="forbid", strict=True)

    scope: str = Field(max_length=300)
    period: Period
    usd: float | None = Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)
    tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


@router.get("/budgets", response_model=Budgets)
async def list_budgets(request: Request) -> dict[str, Any]:
    found = await budgets.statuses_async(request.app.state.redis, None, time.time())
    return {"budgets": budgets.budgets_json(found)}


@router.put("/budgets", response_model=BudgetState)
async def set_budget(body: BudgetBody, request: Request,
                     who: Admin) -> dict[str, Any]:
    if body.usd is None and body.tokens is None:
        raise HTTPException(422, "a budget needs a limit: usd, tokens or both")
    r = request.app.state.redis
    budget = Budget(scope=_scope(body.scope), period=body.period,
                    usd_micros=None if body.usd is None else budgets.usd_micros(body.usd),
                    tokens=body.tokens, set_by=who.name)
    await budgets.put_async(r, budget)
    await audit.arecord(r, "admin", "budget.set", "ok", actor=who.actor, scope=budget.scope,
                        period=budget.period, usd=body.usd, tokens=body.tokens)
    (status,) = [s for s in await budgets.statuses_async(r, [budget.scope], time.time())
                 if s.budget.period == budget.period]
    return status.as_json()


@router.delete("/budgets", response_model=BudgetRemoved,
                responses=refusals({404: "No budget on that scope for that period."}))
async def remove_budget(request: Request, scope: str, period: Period,
                        who: Admin) -> dict[str, Any]:
    exact, r = _scope(scope), request.app.state.redis
    if not await budgets.remove_async(r, exact, period):
        raise HTTPException(404, f"no {ADJECTIVE[period]} budget on {exact}")
    await audit.arecord(r, "admin", "budget.remove", "ok", actor=who.actor, scope=exact,
                        period=period)
    return {"removed": {"scope": exact, "period": period}}
