"""The console's operations views, over the same stores and ``/v1`` routes a script uses:

* ``/console/audit?agent=&run=&kind=&limit=``: the audit trail, newest first, filtered on an
  agent, a run and a kind; "Verify chain" asks ``GET /v1/audit/verify`` (any role);
* ``/console/usage?scope=&by=``: a scope's spending over time (``total``, ``agent:NAME``,
  ``conversation:KEY``, ``user:ID``; by hour, day or month) as a bar chart, what each agent,
  conversation and user spent today, and the budgets against their spending. An admin sets a
  budget and clears one through ``PUT|DELETE /v1/budgets`` (``static/ops.js``); the form and
  the buttons are not drawn for other roles, and the API refuses them anyway.

The charts are plain HTML: each bar carries its share in ``data-pct``, which the script turns
into its height (the CSP allows no inline style); the budgets are ``<progress>`` bars.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response

from fermix_gateway.api.usage import get_usage
from fermix_gateway.console.render import page, signed_in, to_login
from fermix_shared import keys
from fermix_shared.access.tokens import allows
from fermix_shared.audit.model import KINDS
from fermix_shared.audit.store import MAX_SCAN, PAGE, entry_json, matches, parse_entry
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import format_usd
from fermix_shared.usage.periods import PERIODS, Period
from fermix_shared.usage.scopes import TOTAL

router = APIRouter(prefix="/console", include_in_schema=False)
MAX_ENTRIES = 1000
# Today's spenders shown per kind of scope (the costliest).
TOP_SCOPES = 10


def when_text(ts_ms: int) -> str:
    """An entry's time, UTC to the second: ``2025-01-31 12:00:05``."""
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


async def audit_entries(r: Any, agent: str, run: str, kind: str, limit: int
                        ) -> list[dict[str, Any]]:
    """The newest ``limit`` entries matching the filters, newest first (the newest
    :data:`MAX_SCAN` entries are looked at, as ``/v1/audit/recent`` does)."""
    head = await r.hget(keys.audit_head(), "seq")
    anchor = await r.hget(keys.audit_anchor(), "seq")
    top, bottom = int(head or 0), int(anchor or 0)
    bottom = max(bottom, top - MAX_SCAN)
    out: list[dict[str, Any]] = []
    seq = top
    while seq > bottom and len(out) < limit:
        low = max(bottom, seq - PAGE)
        for raw in await r.hmget(keys.audit_entries(), [str(s) for s in range(seq, low, -1)]):
            entry = parse_entry(raw)
            if entry is None or not matches(entry, agent, run) or (kind and entry.kind != kind):
                continue
            out.append({**entry_json(entry), "when": when_text(entry.ts), "details": " ".join(
                f"{k}={v}" for k, v in sorted(entry.detail.items()) if v is not None)})
            if len(out) >= limit:
                break
        seq = low
    return out


@router.get("/audit")
async def audit_page(
    request: Request,
    agent: str = Query(default="", max_length=200),
    run: str = Query(default="", max_length=200),
    kind: str = Query(default="", max_length=20),
    limit: int = Query(default=100, ge=1, le=MAX_ENTRIES),
) -> Response:
    """The audit trail, newest first, with its filters and the chain's check."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    if kind and kind not in KINDS:
        return page(request, "error.html", caller, status=422,
                    error=f"No audit entry is of kind {kind!r} (one of {', '.join(KINDS)}).")
    entries = await audit_entries(request.app.state.redis, agent.strip(), run.strip(), kind,
                                  limit)
    return page(request, "audit.html", caller, entries=entries, kinds=KINDS,
                filters={"agent": agent, "run": run, "kind": kind, "limit": limit})


def chart(buckets: list[dict[str, Any]]) -> dict[str, Any]:
    """A series (newest first, as ``/v1/usage`` answers) as bars, oldest first: each with its
    label, its value's text and its share of the largest (``pct``). Dollars when anything
    was priced, else tokens."""
    usd = any(b["usdMicros"] for b in buckets)
    values = [b["usdMicros"] if usd else b["tokens"] for b in buckets]
    top = max(values, default=0) or 1
    bars = [{"label": b["bucket"], "pct": round(v * 100 / top, 1),
             "text": format_usd(v) if usd else f"{v:,} tokens", "calls": b["calls"]}
            for b, v in zip(reversed(buckets), reversed(values), strict=True)]
    total = sum(values)
    return {"bars": bars, "measure": "USD" if usd else "tokens",
            "total": format_usd(total) if usd else f"{total:,} tokens"}


async def _today(request: Request) -> dict[str, list[dict[str, Any]]]:
    """The costliest agents, conversations and users of today."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in ("agent", "conversation", "user"):
        found = await get_usage(request, scope=kind, period="day", by=None, last=None)
        out[kind] = [{**s, "spend": format_usd(s["usdMicros"])}
                     for s in found["scopes"][:TOP_SCOPES]]
    return out


def _budget_rows(found: list[budgets.BudgetStatus]) -> list[dict[str, Any]]:
    """Each budget as the API shows it, with its amounts in words and its bar's value."""
    rows = []
    for s in found:
        b, words = s.budget, []
        if b.usd_micros is not None:
            words.append(f"{format_usd(s.spent.usd_micros)} of {format_usd(b.usd_micros)}")
        if b.tokens is not None:
            words.append(f"{s.spent.tokens:,} of {b.tokens:,} tokens")
        j = s.as_json()
        rows.append({**j, "amounts": "; ".join(words), "bar": min(j["percent"], 100.0)})
    return rows


@router.get("/usage")
async def usage_page(
    request: Request,
    scope: str = Query(default=TOTAL, max_length=300),
    by: Literal["hour", "day", "month"] = "day",
) -> Response:
    """A scope's spending over time, today's spenders, and the budgets."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    scope = scope.strip() or TOTAL
    try:
        series = await get_usage(request, scope=scope, period=None, by=by, last=None)
    except HTTPException as e:
        return page(request, "error.html", caller, status=422, error=str(e.detail))
    r = request.app.state.redis
    found = await budgets.statuses_async(r, None, time.time())
    periods: tuple[Period, ...] = PERIODS
    return page(request, "usage.html", caller, scope=series["scope"], by=by,
                chart=chart(series["buckets"]), today=await _today(request),
                budgets=_budget_rows(found), periods=periods,
                may_set=allows(caller.role, "admin"))
