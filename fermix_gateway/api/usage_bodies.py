"""Response bodies of ``GET /v1/usage`` and ``/v1/budgets`` (fermix_gateway/api/usage.py says
what each answer means). ``GET /v1/usage`` answers one of four shapes, by its query: the
fleet's split by kind (``by=kind``), every scope of a kind ranked (``scope=agent``...), one
scope's series (``by=hour|day|month``), or one scope's current periods."""

from __future__ import annotations

from typing import Literal

from fermix_gateway.api.wire import Body, Number
from fermix_shared.usage.periods import Period


class Totals(Body):
    """What calls cost: tokens (``inputTokens`` counts the cached ones, ``outputTokens`` the
    reasoning ones), calls, ``usd`` (``usdMicros`` exactly), calls without a price."""

    inputTokens: int
    outputTokens: int
    tokens: int
    calls: int
    usd: float
    usdMicros: int
    unpricedCalls: int
    cacheReadTokens: int
    cacheWriteTokens: int
    reasoningTokens: int


class BudgetLimit(Body):
    """A budget's limits (either may be null)."""

    usd: float | None
    tokens: int | None


class Spent(Body):
    """What the budget's scope spent in the current period."""

    usd: float
    tokens: int


class BudgetState(Body):
    """A budget against its spending in the current period."""

    scope: str
    period: Period
    limit: BudgetLimit
    spent: Spent
    percent: Number
    reached: bool
    resetsAt: int
    setAt: int
    setBy: str


class Budgets(Body):
    """``GET /v1/budgets``: every budget."""

    budgets: list[BudgetState]


class BudgetKey(Body):
    """A budget's scope and period."""

    scope: str
    period: Period


class BudgetRemoved(Body):
    """``DELETE /v1/budgets``."""

    removed: BudgetKey


class Bucket(Totals):
    """One bucket of a scope: its id and start."""

    bucket: str
    start: int


class CurrentBucket(Bucket):
    """The current bucket of a period, and when the next starts."""

    resetsAt: int


class KindTotals(Totals):
    """The calls one kind of work made (``turn``, ``scheduled``, ``subagent``...)."""

    kind: str


class KindBucket(Body):
    """A period's current bucket, split by kind."""

    bucket: str
    start: int
    resetsAt: int
    kinds: list[KindTotals]


class UsageByKind(Body):
    """``by=kind``: every call fleet-wide, by what made it, per period."""

    scope: str
    by: Literal["kind"]
    periods: dict[Period, KindBucket]


class ScopeTotals(Totals):
    """One scope's usage in the period."""

    scope: str


class UsageRanking(Body):
    """``scope=agent|conversation|user``: every scope of the kind with usage in the current
    ``period``, costliest first."""

    kind: str
    period: Period
    bucket: str
    start: int
    resetsAt: int
    scopes: list[ScopeTotals]


class UsageSeries(Body):
    """``by=hour|day|month``: one scope's buckets, newest first, with its budgets."""

    scope: str
    budgets: list[BudgetState]
    unpricedModels: dict[str, int]
    by: Period
    buckets: list[Bucket]


class UsageNow(Body):
    """One scope's current hour, day and month (or the ``period`` asked), with its budgets."""

    scope: str
    budgets: list[BudgetState]
    unpricedModels: dict[str, int]
    periods: dict[Period, CurrentBucket]


Usage = UsageByKind | UsageRanking | UsageSeries | UsageNow
