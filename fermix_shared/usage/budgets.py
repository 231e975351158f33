"""Budgets: limits in USD and/or tokens on a scope (``total``, ``agent:ops``, a conversation, a
user) for a period (UTC hour, day or month), stored in Redis (``keys.budgets``).

What a budget does (the seed's "Budget Tracking"; children's spending counts against the
parent, since subagents and skills are charged to their parent turn's scopes):

* at ``warn_at`` (80 %) of a limit, the conversation whose turn crossed it is warned once per
  scope and period (:func:`warning_text`, :func:`mark_warned`);
* at 100 %, new turns charged to that scope are refused until the period resets
  (:func:`refusal_text`); a turn already running is never cut off, so spending can end a
  little above a limit.

Everything here is shared by the worker (the check at turn start, the warning after a turn)
and the gateway (``/v1/budgets``, ``/v1/usage``, ``/v1/status``, ``/usage``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
import redis.asyncio as aioredis
from pydantic import Field, model_validator

from fermix_shared import keys
from fermix_shared.records import VersionedRecord
from fermix_shared.usage.periods import (
    ADJECTIVE,
    PERIODS,
    Period,
    bucket_id,
    next_start,
    reset_phrase,
)
from fermix_shared.usage.scopes import ScopeKind, scope_kind
from fermix_shared.usage.store import BucketRef, Totals, totals, totals_async

log = logging.getLogger(__name__)


class Budget(VersionedRecord):
    """One limit: on ``scope`` per ``period``, in micro-dollars and/or tokens (input plus
    output)."""

    scope: str
    period: Period
    usd_micros: int | None = Field(default=None, ge=1)
    tokens: int | None = Field(default=None, ge=1)
    set_at: float = Field(default_factory=time.time)
    set_by: str = ""

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if self.usd_micros is None and self.tokens is None:
            raise ValueError("a budget needs a limit in USD or in tokens (or both)")
        return self

    @property
    def field(self) -> str:
        return budget_field(self.scope, self.period)

    def limit_json(self) -> dict[str, Any]:
        return {"usd": None if self.usd_micros is None else self.usd_micros / 1e6,
                "tokens": self.tokens}


def budget_field(scope: str, period: Period) -> str:
    return f"{scope}|{period}"


def usd_micros(usd: float) -> int:
    """Dollars as whole micro-dollars. ValueError when not a positive finite amount."""
    if not math.isfinite(usd) or usd <= 0:
        raise ValueError(f"a USD limit is a positive amount, not {usd!r}")
    return round(usd * 1_000_000)


@dataclass(frozen=True)
class BudgetStatus:
    """A budget against what its scope spent in the current period."""

    budget: Budget
    spent: Totals
    when: datetime | float

    @property
    def usd_share(self) -> float | None:
        b = self.budget
        return None if b.usd_micros is None else self.spent.usd_micros / b.usd_micros

    @property
    def token_share(self) -> float | None:
        b = self.budget
        return None if b.tokens is None else self.spent.tokens / b.tokens

    @property
    def share(self) -> float:
        """The larger share of the limits used (1.0 = reached)."""
        return max(s for s in (self.usd_share, self.token_share) if s is not None)

    @property
    def by_usd(self) -> bool:
        """Whether the USD limit is the one nearer (or past) its end."""
        usd, tokens = self.usd_share, self.token_share
        return usd is not None and (tokens is None or usd >= tokens)

    @property
    def reached(self) -> bool:
        return self.share >= 1.0

    @property
    def resets_at(self) -> datetime:
        return next_start(self.budget.period, self.when)

    def as_json(self) -> dict[str, Any]:
        """The wire shape (``/v1/status``'s ``budgets``, ``/v1/budgets``)."""
        b = self.budget
        return {
            "scope": b.scope, "period": b.period, "limit": b.limit_json(),
            "spent": {"usd": self.spent.usd_micros / 1e6, "tokens": self.spent.tokens},
            "percent": round(self.share * 100, 1), "reached": self.reached,
            "resetsAt": int(self.resets_at.timestamp() * 1000),
            "setAt": int(b.set_at * 1000), "setBy": b.set_by,
        }


# --- storage -----------------------------------------------------------------------------------

def _parse(raw: Mapping[Any, Any]) -> list[Budget]:
    out = []
    for field, value in raw.items():
        try:
            out.append(Budget.model_validate_json(value))
        except ValueError as e:  # another release's record: never half-read
            log.warning("budget %s not read, ignored: %s", field, e)
    return sorted(out, key=lambda b: (b.scope, PERIODS.index(b.period)))


def load(r: redis.Redis) -> list[Budget]:
    """Every budget, by scope then period."""
    return _parse(r.hgetall(keys.budgets()))


async def load_async(r: aioredis.Redis) -> list[Budget]:
    return _parse(await r.hgetall(keys.budgets()))


def put(r: redis.Redis, budget: Budget) -> None:
    r.hset(keys.budgets(), budget.field, budget.model_dump_json())


async def put_async(r: aioredis.Redis, budget: Budget) -> None:
    await r.hset(keys.budgets(), budget.field, budget.model_dump_json())


def remove(r: redis.Redis, scope: str, period: Period) -> bool:
    return bool(r.hdel(keys.budgets(), budget_field(scope, period)))


async def remove_async(r: aioredis.Redis, scope: str, period: Period) -> bool:
    return bool(await r.hdel(keys.budgets(), budget_field(scope, period)))


def _on(budgets: list[Budget], scopes: Sequence[str] | None) -> list[Budget]:
    return budgets if scopes is None else [b for b in budgets if b.scope in scopes]


def _refs(budgets: list[Budget], when: datetime | float) -> list[BucketRef]:
    return [BucketRef(b.scope, b.period, when) for b in budgets]


def statuses(r: redis.Redis, scopes: Sequence[str] | None, when: datetime | float,
             declared: Mapping[Any, Any] | None = None) -> list[BudgetStatus]:
    """The budgets on ``scopes`` (every budget when None) against the current period's
    spending. One round trip when none applies, two otherwise; none and one when the caller
    read ``keys.budgets()`` already (``declared``, as HGETALL gave it)."""
    budgets = _on(load(r) if declared is None else _parse(declared), scopes)
    spent = totals(r, _refs(budgets, when))
    return [BudgetStatus(b, s, when) for b, s in zip(budgets, spent, strict=True)]


async def statuses_async(r: aioredis.Redis, scopes: Sequence[str] | None,
                         when: datetime | float) -> list[BudgetStatus]:
    budgets = _on(await load_async(r), scopes)
    spent = await totals_async(r, _refs(budgets, when))
    return [BudgetStatus(b, s, when) for b, s in zip(budgets, spent, strict=True)]


def blocking(found: Sequence[BudgetStatus]) -> BudgetStatus | None:
    """The reached budget that holds a new turn back longest (its reset is the one that
    matters), or None when none is reached."""
    reached = [s for s in found if s.reached]
    return max(reached, key=lambda s: (s.resets_at, s.share), default=None)


def mark_warned(r: redis.Redis, status: BudgetStatus, what: str = "") -> bool:
    """True the first time this budget (scope, period and limits) is marked warned in its
    current bucket (for ``what``: ``""`` is the conversation's warning, ``alert:warn`` and
    ``alert:cap`` the owners' alerts): the caller then sends it."""
    b = status.budget
    key = keys.budget_warned(b.period, bucket_id(b.period, status.when))
    field = f"{b.scope}|{b.usd_micros or ''}|{b.tokens or ''}" + (f"|{what}" if what else "")
    pipe = r.pipeline(transaction=True)
    pipe.hsetnx(key, field, int(time.time() * 1000))
    pipe.expireat(key, int(status.resets_at.timestamp()) + 24 * 3600)
    first, _ = pipe.execute()
    return bool(first)


# --- what people read ----------------------------------------------------------------------------

# Who a budget belongs to, as the conversation it applies to reads it: subject, verb, possessive.
_WHO: dict[ScopeKind, tuple[str, str, str]] = {
    "agent": ("this agent", "has", "its"),
    "conversation": ("this conversation", "has", "its"),
    "user": ("you", "have", "your"),
    "total": ("all agents together", "have", "their"),
}
# Whose budget, before its name.
_WHOSE: dict[ScopeKind, str] = {
    "agent": "this agent's", "conversation": "this conversation's", "user": "your",
    "total": "the shared",
}


def format_usd(micros: int) -> str:
    """``$5.00``, ``$0.42``, ``$0.0042``: cents, or four decimals below a dollar when cents
    would hide the amount."""
    usd = micros / 1_000_000
    if micros >= 1_000_000 or micros % 10_000 == 0:
        return f"${usd:,.2f}"
    text = f"{usd:.4f}".rstrip("0")
    return f"${text}0" if len(text.split(".")[1]) < 2 else f"${text}"


def spend_text(t: Totals) -> str:
    """``$0.42 (12,345 tokens, 8 calls)``; with calls of models without a price, the cost is
    said to be more than its sum: ``$0.42 + unknown (..., 2 of an unknown model)``."""
    calls = f"{t.calls:,} call{'' if t.calls == 1 else 's'}"
    if not t.unpriced_calls:
        return f"{format_usd(t.usd_micros)} ({t.tokens:,} tokens, {calls})"
    return (f"{format_usd(t.usd_micros)} + unknown ({t.tokens:,} tokens, {calls}, "
            f"{t.unpriced_calls:,} of an unknown model)")


def _amounts(status: BudgetStatus) -> tuple[str, str]:
    """(spent, limit) in the measure nearer its end."""
    b, spent = status.budget, status.spent
    if status.by_usd and b.usd_micros is not None:
        return format_usd(spent.usd_micros), format_usd(b.usd_micros)
    return f"{spent.tokens:,}", f"{b.tokens or 0:,} tokens"


def refusal_text(status: BudgetStatus) -> str:
    """The reply to a turn refused by ``status``: which limit, and when it resets."""
    who, verb, its = _WHO[scope_kind(status.budget.scope)]
    spent, limit = _amounts(status)
    used = "spent" if status.by_usd else "used"
    return (f"{who[0].upper()}{who[1:]} {verb} reached {its} {ADJECTIVE[status.budget.period]} "
            f"budget ({spent} of {limit} {used}); it resets "
            f"{reset_phrase(status.budget.period, status.when)}.")


def cutoff_text(status: BudgetStatus, worst_usd_micros: int, worst_tokens: int) -> str:
    """The reply of a running turn stopped at ``status``'s budget: its next model call (at
    most ``worst_*``) did not fit what is left; which limit, and when it resets."""
    whose = _WHOSE[scope_kind(status.budget.scope)]
    spent, limit = _amounts(status)
    used = "spent" if status.by_usd else "used"
    step = (format_usd(worst_usd_micros) if status.by_usd and status.budget.usd_micros
            else f"{worst_tokens:,} tokens")
    return (f"I stopped here: the next step could take up to {step}, more than is left of "
            f"{whose} {ADJECTIVE[status.budget.period]} budget ({spent} of {limit} "
            f"{used}); it resets {reset_phrase(status.budget.period, status.when)}.")


def warning_text(status: BudgetStatus) -> str:
    """The notice sent once when a turn took ``status``'s scope past ``warn_at``."""
    who, verb, its = _WHO[scope_kind(status.budget.scope)]
    spent, limit = _amounts(status)
    period = status.budget.period
    reset = reset_phrase(period, status.when)
    if status.reached:
        return (f"Heads up: {who} {verb} used all of {its} {ADJECTIVE[period]} budget "
                f"({spent} of {limit}); new requests are refused until it resets {reset}.")
    percent = math.floor(status.share * 100)
    return (f"Heads up: {who} {verb} used {percent}% of {its} {ADJECTIVE[period]} budget "
            f"({spent} of {limit}). Once it is reached, new requests are refused until it "
            f"resets {reset}.")


def describe(status: BudgetStatus) -> str:
    """One line for logs and a run's error detail."""
    b = status.budget
    spent, limit = _amounts(status)
    return f"budget {b.scope} per {b.period}: {spent} of {limit} ({status.share:.0%})"


def summary(found: Sequence[BudgetStatus]) -> list[str]:
    """Readable lines for ``/usage`` and ``fermix budget list``."""
    lines = []
    for s in found:
        b = s.budget
        spent, limit = _amounts(s)
        lines.append(f"{b.scope} {ADJECTIVE[b.period]}: {spent} of {limit} "
                     f"({math.floor(s.share * 100)}%), resets {reset_phrase(b.period, s.when)}")
    return lines


def budgets_json(found: Sequence[BudgetStatus]) -> list[dict[str, Any]]:
    return [s.as_json() for s in found]
