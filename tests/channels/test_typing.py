"""The typing indicator: every 4 s while a turn runs, never past 5 minutes, stops with the turn.

A fake clock and a fake ``wait`` that advances it make the cadence exact without sleeping; one
real-time test checks that the default wait stops by itself.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from fermix_shared.channels.typing import TypingIndicator


class FakeTime:
    """A clock that moves only when the indicator waits.

    Until ``turn_ends_at``, ``wait`` advances the clock and returns at once. A wait that would
    cross it announces ``at_turn_end`` and blocks until the test asks to stop (``stop``), as a
    turn that ends mid-wait does; it then returns True.
    """

    def __init__(self, turn_ends_at: float = float("inf")) -> None:
        self.now = 0.0
        self.turn_ends_at = turn_ends_at
        self.at_turn_end = threading.Event()
        self.asked_to_stop = threading.Event()

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        if self.now + seconds > self.turn_ends_at:
            self.at_turn_end.set()
            return self.asked_to_stop.wait(10)
        self.now += seconds
        return self.asked_to_stop.is_set()

    def stop(self) -> None:
        self.asked_to_stop.set()


def test_sends_every_4_seconds_and_never_after_5_minutes() -> None:
    ft = FakeTime()
    sent: list[float] = []
    with TypingIndicator(lambda: sent.append(ft.now), clock=ft.clock, wait=ft.wait) as ti:
        assert ti.wait_finished(10), "the indicator should stop by itself after 5 minutes"
    assert sent == [4.0 * i for i in range(75)]
    assert sent[-1] == 296.0 < 300.0
    assert ft.now == 300.0


def test_a_turn_that_ends_early_stops_the_sends() -> None:
    ft = FakeTime(turn_ends_at=10.0)
    sent: list[float] = []
    with TypingIndicator(lambda: sent.append(ft.now), clock=ft.clock, wait=ft.wait):
        assert ft.at_turn_end.wait(10)
        ft.stop()
    assert sent == [0.0, 4.0, 8.0]


def test_a_failing_send_keeps_the_cadence_and_logs_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ft = FakeTime(turn_ends_at=18.0)
    attempts: list[float] = []

    def flaky() -> None:
        attempts.append(ft.now)
        if len(attempts) % 2:
            raise RuntimeError("POST https://api.telegram.org/bot123:SECRET/sendChatAction")

    caplog.set_level(logging.DEBUG, logger="fermix_shared.channels.typing")
    with TypingIndicator(flaky, clock=ft.clock, wait=ft.wait):
        assert ft.at_turn_end.wait(10)
        ft.stop()
    assert attempts == [0.0, 4.0, 8.0, 12.0, 16.0]
    failures = [r for r in caplog.records if "typing indicator send failed" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "RuntimeError" in failures[0].getMessage()
    assert "SECRET" not in caplog.text


def test_the_cap_and_interval_are_configurable() -> None:
    ft = FakeTime()
    sent: list[float] = []
    with TypingIndicator(lambda: sent.append(ft.now), interval=3.0, max_duration=10.0,
                         clock=ft.clock, wait=ft.wait) as ti:
        assert ti.wait_finished(10)
    assert sent == [0.0, 3.0, 6.0, 9.0]


def test_leaving_the_context_interrupts_the_wait_at_once() -> None:
    first = threading.Event()
    sent: list[float] = []

    def send() -> None:
        sent.append(time.monotonic())
        first.set()

    ti = TypingIndicator(send, interval=60.0)
    with ti:
        assert first.wait(5)
        left = time.monotonic()
    assert time.monotonic() - left < 1.0, "exit should not wait for the next 60 s tick"
    assert ti.wait_finished(0)
    assert len(sent) == 1


def test_real_time_indicator_stops_by_itself() -> None:
    sent: list[float] = []
    started = time.monotonic()
    with TypingIndicator(lambda: sent.append(time.monotonic()), interval=0.05,
                         max_duration=0.5) as ti:
        assert ti.wait_finished(2.0), "the indicator should stop by itself after 0.5 s"
        stopped = time.monotonic()
    assert 0.5 <= stopped - started < 2.0
    assert 1 <= len(sent) <= 10
    assert all(t - started < 0.5 for t in sent)


def test_an_indicator_runs_once() -> None:
    ti = TypingIndicator(lambda: None, interval=60.0)
    with ti:
        pass
    with pytest.raises(RuntimeError), ti:
        pass


def test_an_indicator_shown_before_entering_refreshes_and_is_cleared_at_the_cap() -> None:
    ft = FakeTime()
    sent: list[float] = []
    expired: list[float] = []
    with TypingIndicator(lambda: sent.append(ft.now), clock=ft.clock, wait=ft.wait,
                         send_at_once=False, on_expire=lambda: expired.append(ft.now)) as ti:
        assert ti.wait_finished(10)
    assert sent == [4.0 * i for i in range(1, 75)]
    assert expired == [300.0]


def test_a_turn_that_ends_before_the_cap_is_not_expired() -> None:
    ft = FakeTime(turn_ends_at=10.0)
    expired: list[float] = []
    with TypingIndicator(lambda: None, clock=ft.clock, wait=ft.wait,
                         on_expire=lambda: expired.append(ft.now)):
        assert ft.at_turn_end.wait(10)
        ft.stop()
    assert expired == []
