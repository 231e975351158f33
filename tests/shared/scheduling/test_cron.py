"""Cron expressions in IANA time zones, across the 2026 US and EU daylight saving changes.

2026: the US springs forward on March 8 and falls back on November 1; the EU on March 29 and
October 25.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fermix_shared.scheduling.cron import CronError, next_after, parse


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def runs(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        after = next_after(expr, tz, after)
        out.append(after)
    return out


def test_a_local_time_skipped_by_spring_forward_is_skipped_that_day() -> None:
    # 02:30 does not exist in New York on 2026-03-08 (02:00 EST jumps to 03:00 EDT).
    assert runs("30 2 * * *", "America/New_York", utc(2026, 3, 6, 12), 3) == [
        utc(2026, 3, 7, 7, 30),   # 02:30 EST
        utc(2026, 3, 9, 6, 30),   # 02:30 EDT: March 8 has no 02:30
        utc(2026, 3, 10, 6, 30),
    ]


def test_an_ambiguous_fall_back_time_fires_once() -> None:
    # 01:30 happens twice in New York on 2026-11-01; the job fires at the first (EDT) only.
    assert runs("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), 2) == [
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 2, 6, 30),
    ]
    # 02:30 happens twice in Berlin on 2026-10-25 (CEST, then CET).
    assert runs("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]


def test_berlin_one_am_follows_the_offset_change() -> None:
    assert runs("0 1 * * *", "Europe/Berlin", utc(2026, 10, 23, 12), 3) == [
        utc(2026, 10, 23, 23),  # 01:00 CEST (+02)
        utc(2026, 10, 24, 23),
        utc(2026, 10, 26, 0),   # 01:00 CET (+01), 25 hours later
    ]


def test_every_day_at_nine_in_paris_moves_an_hour_in_utc_at_the_spring_change() -> None:
    assert runs("0 9 * * *", "Europe/Paris", utc(2026, 3, 28), 2) == [
        utc(2026, 3, 28, 8),  # CET
        utc(2026, 3, 29, 7),  # CEST from 02:00 that morning
    ]


def test_an_hourly_job_skips_the_missing_hour_and_does_not_repeat_the_doubled_one() -> None:
    spring = runs("30 * * * *", "America/New_York", utc(2026, 3, 8, 5), 3)
    assert spring == [utc(2026, 3, 8, 5, 30), utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7, 30)]
    # Local: 00:30 EST, 01:30 EST, then 03:30 EDT (no 02:30 exists): one real hour apart.
    fall = runs("30 * * * *", "America/New_York", utc(2026, 11, 1, 4), 3)
    # 00:30 EDT, 01:30 EDT (first of two), 02:30 EST: the second 01:30 is not fired.
    assert fall == [utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 30)]


@pytest.mark.parametrize(("expr", "after", "expected"), [
    ("*/15 * * * *", utc(2026, 1, 1, 10, 7), utc(2026, 1, 1, 10, 15)),
    ("0 9 * * mon-fri", utc(2026, 1, 2, 10), utc(2026, 1, 5, 9)),        # Fri -> Mon
    ("0 0 1 jan,jul *", utc(2026, 2, 1), utc(2026, 7, 1)),
    ("5 4 * * 7", utc(2026, 1, 1), utc(2026, 1, 4, 4, 5)),               # 7 is Sunday
    ("0 12 13 * 5", utc(2026, 2, 1), utc(2026, 2, 6, 12)),               # 13th OR Friday
    ("10-20/5 3 * * *", utc(2026, 1, 1, 3, 11), utc(2026, 1, 1, 3, 15)),
    ("30/10 0 * * *", utc(2026, 1, 1), utc(2026, 1, 1, 0, 30)),
    ("@daily", utc(2026, 1, 1, 0, 0), utc(2026, 1, 2)),
    ("0 0 29 2 *", utc(2026, 1, 1), utc(2028, 2, 29)),
])
def test_field_syntax(expr: str, after: datetime, expected: datetime) -> None:
    assert next_after(expr, "UTC", after) == expected


@pytest.mark.parametrize(("expr", "message"), [
    ("* * * *", "5 fields"),
    ("60 * * * *", "minute 60 is outside 0-59"),
    ("0 24 * * *", "hour 24 is outside 0-23"),
    ("0 0 * foo *", "'foo' is not a valid month"),
    ("*/0 * * * *", "must be a positive number"),
    ("0 0 5-1 * *", "runs backwards"),
])
def test_bad_expressions_say_what_is_wrong(expr: str, message: str) -> None:
    with pytest.raises(CronError, match=message):
        parse(expr)


def test_impossible_dates_and_unknown_zones_are_refused() -> None:
    with pytest.raises(CronError, match="never matches"):
        next_after("0 0 30 2 *", "UTC", utc(2026, 1, 1))
    with pytest.raises(CronError, match="unknown time zone 'Mars/Olympus'"):
        next_after("0 0 * * *", "Mars/Olympus", utc(2026, 1, 1))
