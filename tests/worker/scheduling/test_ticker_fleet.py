"""Scheduled jobs across a fleet: two real `celery beat` processes (RedBeat), two real
`celery worker` processes, a real gateway for Telegram webhooks, the scripted LLM and a fake
Telegram Bot API, all on a private redis-server. Jobs are managed with the real `fermix` CLI.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.procs import Managed, start_redis, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.scheduling.jobs import JobRun, now_ms
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from tests.channels.test_channels_e2e import TG_SECRET, post_tg, tg_update
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import uniq

OWNER, GUEST = 4242, 4343


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram() as fake:
        yield fake


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLMServer, logs_dir: Path,
          tg: FakeTelegram) -> Iterator[Stack]:
    redis_proc, url = start_redis(tmp_path_factory.mktemp("sched-fleet-redis"),
                                  log_path=logs_dir / "sched-redis.log")
    env = {
        **provider_env(llm, "openai"),
        "FERMIX_TELEGRAM_BOT_TOKEN": tg.token,
        "FERMIX_TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
        "FERMIX_TELEGRAM_API_BASE": tg.url,
        "FERMIX_TELEGRAM_BOT_USERNAME": tg.bot_username,
        "FERMIX_OWNER_IDS": f"telegram:{OWNER}",
        "FERMIX_ALLOWED_IDS": f"telegram:{GUEST}",
    }
    s = start_stack("sched", url, 0, env, logs_dir, workers=2)
    try:
        for i in (1, 2):
            start_beat(s, f"sched-beat{i}")
        wait_until(lambda: lock_holder(s) is not None, 30, "a beat holding the lock")
        yield s
    finally:
        for p in s.procs:  # signal everyone first: they wind down in parallel
            p.kill(signal.SIGTERM)
        s.stop()
        redis_proc.stop()


def start_beat(stack: Stack, name: str) -> Managed:
    beat = Managed(name, [sys.executable, "-m", "fermix_cli", "beat", "--log-level", "INFO"],
                   env=stack.env, log_path=stack.logs / f"{name}.log")
    stack.procs.append(beat)
    return beat


def beats(stack: Stack) -> list[Managed]:
    return [p for p in stack.procs if "-beat" in p.name and p.proc.poll() is None]


def lock_holder(stack: Stack) -> Managed | None:
    """The running beat whose log says it holds RedBeat's lock (and never released it)."""
    for beat in beats(stack):
        log = beat.log_path.read_text() if beat.log_path else ""
        if "beat: Acquired lock" in log and "beat: Releasing lock" not in log:
            return beat
    return None


def fermix(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", "schedule", *args],
                          env=stack.env, capture_output=True, text=True, timeout=30)


def add(stack: Stack, name: str, *args: str) -> None:
    out = fermix(stack, "add", name, *args)
    assert out.returncode == 0, out.stderr


def runs(stack: Stack, name: str) -> list[JobRun]:
    """The job's runs, oldest first."""
    return list(reversed(JobStore(stack.redis()).runs(name)))


def model_calls(llm: ScriptedLLMServer, text: str) -> int:
    """Model calls made by runs whose prompt is ``text`` (a post-turn memory review, which
    quotes the exchange, is not one of them)."""
    def prompt(q: dict[str, Any]) -> str:
        users = [m for m in q["body"].get("messages", []) if m.get("role") == "user"]
        return str(users[-1]["content"]) if users else ""

    return sum(1 for q in llm.script.requests if prompt(q) == text)


def in_flight(stack: Stack, name: str) -> list[str]:
    """The job's runs still queued or running (their conversations)."""
    r = stack.redis()
    convs = [*r.zrange(keys.active_index(), 0, -1), *r.zrange(keys.queued_index(), 0, -1)]
    return [c for c in convs if str(c).startswith(f"schedule|{name}|")]


def iso_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def test_an_every_two_seconds_job_fires_once_per_occurrence_and_stops_when_removed(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    name, text = uniq("every2"), uniq("status check")
    assert len(beats(stack)) == 2
    add(stack, name, "--every", "2", "--message", text)
    wait_until(lambda: len(runs(stack, name)) >= 4, 20, "four runs")
    first = runs(stack, name)[:4]
    occurrences = [r.scheduled_for or 0 for r in first]
    assert [b - a for a, b in zip(occurrences, occurrences[1:], strict=False)] == [2000] * 3
    for run in first:  # each ran on time (never early, before the next): about every 2 s
        assert run.status == "ok" and run.trigger == "schedule"
        assert 0 <= (run.started_at or 0) - (run.scheduled_for or 0) < 2000

    # Failover: the beat holding the lock stops; the standby takes over, still once per tick.
    holder = lock_holder(stack)
    assert holder is not None
    holder.stop()
    seen = len(runs(stack, name))
    wait_until(lambda: len(runs(stack, name)) >= seen + 2, 20, "runs after the failover")
    start_beat(stack, uniq("sched-beat"))
    every_run = [r.scheduled_for or 0 for r in runs(stack, name)]
    assert all(b > a and (b - a) % 2000 == 0 for a, b in zip(every_run, every_run[1:], strict=False))

    assert fermix(stack, "rm", name).returncode == 0
    wait_until(lambda: not in_flight(stack, name), 15, "the last run to end")
    calls = model_calls(llm, text)
    time.sleep(4)  # nothing may happen now: there is no event to wait for
    assert model_calls(llm, text) == calls and not in_flight(stack, name)
    assert calls >= seen + 2 and stack.redis().zscore(keys.sched_due(), name) is None


def test_a_paused_job_does_not_fire_until_resumed(stack: Stack, llm: ScriptedLLMServer) -> None:
    paused, control = uniq("paused"), uniq("control")
    add(stack, paused, "--every", "1", "--message", f"{paused} task", "--paused")
    add(stack, control, "--every", "1", "--message", f"{control} task")
    wait_until(lambda: len(runs(stack, control)) >= 2, 15, "two control runs")
    assert runs(stack, paused) == [] and model_calls(llm, f"{paused} task") == 0

    assert fermix(stack, "pause", control).returncode == 0
    wait_until(lambda: not in_flight(stack, control), 15, "control quiet")
    stopped_at = len(runs(stack, control))
    assert fermix(stack, "resume", paused).returncode == 0
    wait_until(lambda: len(runs(stack, paused)) >= 1, 15, "the resumed job to run")
    assert len(runs(stack, control)) == stopped_at
    for name in (paused, control):
        assert fermix(stack, "rm", name).returncode == 0


def test_a_one_shot_job_runs_once_and_delivers_once_to_telegram(
    stack: Stack, llm: ScriptedLLMServer, tg: FakeTelegram
) -> None:
    name, text, chat = uniq("once"), uniq("remind me"), 7001
    # Into the store, as `fermix schedule add --at` writes it (a CLI starting on a loaded
    # machine took longer than the 2 s ahead: "is in the past"; the CLI has its own tests).
    JobStore(stack.redis()).add(new_job(
        name=name, message=text, schedule=make_schedule(at=iso_in(2)),
        delivery=parse_delivery(f"telegram:{chat}", None), trust="operator", created_by="test"))
    wait_until(lambda: len(runs(stack, name)) == 1, 15, "the one run")
    time.sleep(2)  # two more ticks: a one-shot must not fire again
    (run,) = runs(stack, name)
    assert (run.status, run.delivery, run.trigger) == ("ok", "sent", "schedule")
    sent = [m for m in tg.sent() if m["chat_id"] == chat]
    assert [m["text"] for m in sent] == [f'Scripted reply: you said "{text}"']
    assert model_calls(llm, text) == 1
    job = JobStore(stack.redis()).require(name)
    assert job.state == "disabled (done)" and job.next_run_at is None


def test_a_silent_answer_is_not_delivered(stack: Stack, llm: ScriptedLLMServer, tg: FakeTelegram) -> None:
    jobs = {uniq("quiet"): "NO_REPLY", uniq("silent"): "[SILENT]"}
    store = JobStore(stack.redis())
    for i, (name, answer) in enumerate(jobs.items()):
        llm.script.push(Reply(text=answer, match=f"{name} check"))
        # Into the store, as `fermix schedule add` writes it: a CLI process starting on a
        # loaded machine took longer than the 1.5 s ahead the job was set for ("is in the
        # past"); the CLI has its own test below.
        store.add(new_job(name=name, message=f"{name} check",
                          schedule=make_schedule(at=iso_in(1.5)),
                          delivery=parse_delivery(f"telegram:{7100 + i}", None),
                          trust="operator", created_by="test"))
    for i, name in enumerate(jobs):
        wait_until(lambda n=name: len(runs(stack, n)) == 1, 15, f"{name} to run")
        (run,) = runs(stack, name)
        assert (run.status, run.delivery) == ("ok", "silent")
        assert [m for m in tg.sent() if m["chat_id"] == 7100 + i] == []


def test_a_run_missed_while_beat_was_down_fires_once_then_the_schedule_resumes(stack: Stack) -> None:
    # As beat finds it after being down ten minutes: the next run is long past.
    name, store = uniq("missed"), JobStore(stack.redis())
    t = now_ms()
    job = new_job(name=name, message=f"{name} report", schedule=make_schedule(every_s=60),
                  delivery=parse_delivery(None, None), trust="operator", created_by="test")
    assert store.cas(name, None, job.model_copy(update={"next_run_at": t - 10 * 60_000}))
    wait_until(lambda: len(runs(stack, name)) == 1, 15, "the catch-up run")
    time.sleep(2)  # more ticks: no burst of the other nine missed runs
    (run,) = runs(stack, name)
    assert run.trigger == "catch_up" and run.scheduled_for == t - 10 * 60_000
    nxt = store.require(name).next_run_at or 0
    assert now_ms() < nxt <= t + 60_000 and (nxt - t) % 60_000 == 0
    store.remove(name)


def test_the_cli_validates_and_reports(stack: Stack) -> None:
    name = uniq("cli")
    add(stack, name, "--cron", "0 9 * * 1-5", "--tz", "Europe/Paris", "--message", "daily report")
    bad: list[tuple[list[str], int, str]] = [
        (["add", name, "--every", "60", "-m", "x"], 1, "already exists"),
        (["add", "x1", "--cron", "0 9 * * *", "--every", "5", "-m", "x"], 2, "exactly one schedule"),
        (["add", "x2", "-m", "x"], 2, "exactly one schedule"),
        (["add", "x3", "--cron", "0 25 * * *", "-m", "x"], 2, "hour 25 is outside 0-23"),
        (["add", "x4", "--cron", "0 9 * * *", "--tz", "Mars/Base", "-m", "x"], 2, "unknown time zone"),
        (["add", "x5", "--at", "2020-01-01T00:00:00Z", "-m", "x"], 2, "is in the past"),
        (["add", "x6", "--every", "60", "--deliver", "fax:123", "-m", "x"], 2, "delivery target"),
        (["add", "x7", "--every", "soon", "-m", "x"], 2, "whole number of seconds"),
        (["runs", "nope"], 1, "no scheduled job named 'nope'"),
        (["rm", "nope"], 1, "no scheduled job named 'nope'"),
    ]
    with ThreadPoolExecutor(len(bad)) as pool:
        outs = list(pool.map(lambda case: fermix(stack, *case[0]), bad))
    for (args, code, message), out in zip(bad, outs, strict=True):
        assert out.returncode == code, (args, out.stderr)
        assert out.stderr.count("\n") == 1 and message in out.stderr, (args, out.stderr)
    listing = fermix(stack, "list", "--json")
    jobs: list[dict[str, Any]] = json.loads(listing.stdout)
    (mine,) = [j for j in jobs if j["name"] == name]
    assert mine["trust"] == "operator" and mine["schedule"]["tz"] == "Europe/Paris"
    assert not any(j["name"].startswith("x") and len(j["name"]) == 2 for j in jobs)

    assert fermix(stack, "run-now", name).returncode == 0
    wait_until(lambda: len(runs(stack, name)) == 1, 15, "the manual run")
    table = fermix(stack, "runs", name)
    assert table.returncode == 0 and "manual" in table.stdout and "daily report" in table.stdout
    assert fermix(stack, "rm", name).returncode == 0
    assert name not in fermix(stack, "list").stdout


def test_a_guest_cannot_create_a_job_and_an_owner_can_from_telegram(
    stack: Stack, llm: ScriptedLLMServer, tg: FakeTelegram
) -> None:
    ask_guest, ask_owner = uniq("guest wants a job"), uniq("owner wants a job")
    guest_job, owner_job = uniq("guestjob"), uniq("ownerjob")
    for ask, job in ((ask_guest, guest_job), (ask_owner, owner_job)):
        llm.script.push(Reply(tool_calls=[ToolCallSpec("schedule_job", {
            "name": job, "message": "weekly digest", "cron": "0 8 * * mon", "tz": "America/New_York",
        })], match=ask))
    assert post_tg(stack, tg_update(GUEST, GUEST, ask_guest)).status_code == 200
    assert post_tg(stack, tg_update(OWNER, OWNER, ask_owner)).status_code == 200
    for chat in (GUEST, OWNER):
        wait_until(lambda c=chat: any(m["chat_id"] == c for m in tg.sent()), 30, f"reply in {chat}")
    replies = {m["chat_id"]: m["text"] for m in tg.sent() if m["chat_id"] in (GUEST, OWNER)}
    assert "needs read_write access; caller is guest" in replies[GUEST]
    assert f"Scheduled job '{owner_job}'" in replies[OWNER]
    store = JobStore(stack.redis())
    assert store.get(guest_job) is None
    job = store.require(owner_job)
    assert (job.trust, job.created_by, job.delivery.mode) == ("operator", f"telegram:{OWNER}", "origin")
    assert job.delivery.to is not None and job.delivery.to.chat_id == str(OWNER)
    store.remove(owner_job)

