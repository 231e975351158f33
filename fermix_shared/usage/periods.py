"""Usage periods: UTC hours, days and months, their bucket ids and when each resets.

Every bucket is named by its start in UTC (``2025-03-07T14``, ``2025-03-07``, ``2025-03``) and
kept for a while after it ends (:data:`RETENTION`): hours three days, days 100 days, months
two years. A budget's period resets when its bucket ends: the next full hour, midnight UTC,
the first of the next month.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

Period = Literal["hour", "day", "month"]
PERIODS: tuple[Period, ...] = get_args(Period)

# How long a bucket is kept after it ends.
RETENTION: dict[Period, timedelta] = {
    "hour": timedelta(days=3),
    "day": timedelta(days=100),
    "month": timedelta(days=730),
}
# How many buckets back a series may reach (about the retention).
MAX_BUCKETS: dict[Period, int] = {"hour": 72, "day": 100, "month": 24}
ADJECTIVE: dict[Period, str] = {"hour": "hourly", "day": "daily", "month": "monthly"}


def utc(when: datetime | float) -> datetime:
    """``when`` (a unix time or an aware datetime) in UTC."""
    if isinstance(when, int | float):
        return datetime.fromtimestamp(when, UTC)
    if when.tzinfo is None:
        raise ValueError("naive datetime: usage periods are UTC, pass an aware one")
    return when.astimezone(UTC)


def start_of(period: Period, when: datetime | float) -> datetime:
    """The start of the bucket ``when`` falls in."""
    t = utc(when)
    if period == "hour":
        return t.replace(minute=0, second=0, microsecond=0)
    if period == "day":
        return t.replace(hour=0, minute=0, second=0, microsecond=0)
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_start(period: Period, when: datetime | float) -> datetime:
    """When the bucket ``when`` falls in ends: the period's reset time."""
    start = start_of(period, when)
    if period == "hour":
        return start + timedelta(hours=1)
    if period == "day":
        return start + timedelta(days=1)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 \
        else start.replace(month=start.month + 1)


def previous_start(period: Period, start: datetime) -> datetime:
    """The start of the bucket before the one starting at ``start``."""
    if period == "hour":
        return start - timedelta(hours=1)
    if period == "day":
        return start - timedelta(days=1)
    return start.replace(year=start.year - 1, month=12) if start.month == 1 \
        else start.replace(month=start.month - 1)


def bucket_id(period: Period, when: datetime | float) -> str:
    """The bucket's name: ``2025-03-07T14``, ``2025-03-07`` or ``2025-03`` (UTC)."""
    fmt = {"hour": "%Y-%m-%dT%H", "day": "%Y-%m-%d", "month": "%Y-%m"}[period]
    return start_of(period, when).strftime(fmt)


def recent(period: Period, when: datetime | float, count: int) -> list[datetime]:
    """The starts of ``count`` buckets ending with the one ``when`` falls in, newest first."""
    out = [start_of(period, when)]
    while len(out) < count:
        out.append(previous_start(period, out[-1]))
    return out


def expire_at(period: Period, when: datetime | float) -> int:
    """Unix time at which the bucket of ``when`` may go: its end plus its retention."""
    return int((next_start(period, when) + RETENTION[period]).timestamp())


def reset_phrase(period: Period, when: datetime | float) -> str:
    """When the period resets, for a sentence: ``at 15:00 UTC``, ``at 00:00 UTC``,
    ``on 1 April at 00:00 UTC``."""
    reset = next_start(period, when)
    if period == "month":
        return f"on {reset.day} {reset:%B} at 00:00 UTC"
    return f"at {reset:%H:%M} UTC"
