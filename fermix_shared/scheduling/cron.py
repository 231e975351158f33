"""5-field cron expressions evaluated in local wall time of an IANA time zone.

Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or ``jan``-``dec``), day
of week (0-7, 0 and 7 are Sunday, or ``sun``-``sat``). Each field is ``*``, a number, a range
``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n``, or a comma list of those. As in Vixie cron, when
both day of month and day of week are restricted, a day matching either one matches. The
macros ``@yearly``, ``@monthly``, ``@weekly``, ``@daily``, ``@hourly`` are accepted.

Daylight saving time: times are computed on the local wall clock. A local time skipped by a
spring-forward change does not exist that day and is skipped (the job waits for the next
matching time); a local time that occurs twice at a fall-back change fires once, at its first
occurrence (``fold=0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fermix_shared.errors import UserInputError

# How far ahead to look for a matching day before calling an expression impossible.
SEARCH_YEARS = 5

_MONTHS = {m: i for i, m in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# (name, low, high, names)
_FIELDS: list[tuple[str, int, int, dict[str, int]]] = [
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
]


class CronError(UserInputError, ValueError):
    """The expression or the time zone is invalid; the message says what is wrong."""


@dataclass(frozen=True)
class CronSpec:
    """A parsed expression: the allowed values of each field."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_any: bool
    dow_any: bool

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.dom_any or self.dow_any:
            return (self.dom_any or dom) and (self.dow_any or dow)
        return dom or dow


def _value(raw: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    key = raw.lower()
    if key in names:
        return names[key]
    if not key.isdigit():
        raise CronError(f"{raw!r} is not a valid {name}")
    n = int(key)
    if not low <= n <= high:
        raise CronError(f"{name} {n} is outside {low}-{high}")
    return n


def _field(raw: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    out: set[int] = set()
    for part in raw.split(","):
        base, _, step_raw = part.partition("/")
        step = 1
        if step_raw:
            if not step_raw.isdigit() or int(step_raw) == 0:
                raise CronError(f"step {step_raw!r} in the {name} field must be a positive number")
            step = int(step_raw)
        if base == "*":
            lo, hi = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            lo, hi = _value(a, name, low, high, names), _value(b, name, low, high, names)
            if lo > hi:
                raise CronError(f"range {base!r} in the {name} field runs backwards")
        else:
            lo = _value(base, name, low, high, names)
            hi = high if step_raw else lo
        out.update(range(lo, hi + 1, step))
    return out


@lru_cache(maxsize=512)
def parse(expr: str) -> CronSpec:
    """Parse a 5-field expression (or a macro); raises :class:`CronError`."""
    text = _MACROS.get(expr.strip().lower(), expr.strip())
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"a cron expression has 5 fields (minute hour day month weekday), "
                        f"not {len(parts)}: {expr!r}")
    values = [_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in values[4])
    return CronSpec(
        minutes=tuple(sorted(values[0])), hours=tuple(sorted(values[1])),
        days=frozenset(values[2]), months=frozenset(values[3]), weekdays=weekdays,
        dom_any=parts[2] == "*", dow_any=parts[4] == "*",
    )


def zone(tz_name: str) -> ZoneInfo:
    """The IANA time zone ``tz_name``; raises :class:`CronError` when unknown."""
    try:
        return ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise CronError(f"unknown time zone {tz_name!r}") from e


def _exists(local: datetime) -> bool:
    """False for a wall time skipped by a spring-forward change."""
    back = local.astimezone(UTC).astimezone(local.tzinfo)
    return back.replace(tzinfo=None) == local.replace(tzinfo=None)


def next_after(expr: str, tz_name: str, after: datetime) -> datetime:
    """The first time strictly after ``after`` (aware) matching ``expr`` in ``tz_name``, in UTC.

    Raises :class:`CronError` for an invalid expression or zone, or one that never matches
    within 5 years (``0 0 30 2 *``).
    """
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    spec, tz = parse(expr), zone(tz_name)
    start = after.astimezone(tz)
    day = start.date()
    for _ in range(366 * SEARCH_YEARS):
        if spec.day_matches(day):
            for hour in spec.hours:
                for minute in spec.minutes:
                    # fold=0: an ambiguous fall-back time is its first occurrence only.
                    local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz, fold=0)
                    if local.astimezone(UTC) > after and _exists(local):
                        return local.astimezone(UTC)
        day += timedelta(days=1)
    raise CronError(f"{expr!r} never matches a date")


def validate(expr: str, tz_name: str) -> None:
    """Raise :class:`CronError` unless ``expr`` fires at least once in ``tz_name``."""
    next_after(expr, tz_name, datetime.now(UTC))
