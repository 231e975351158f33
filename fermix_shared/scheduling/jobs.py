"""Scheduled jobs: the stored record (:class:`Job`), its schedule and delivery, and its runs.

A job is a versioned JSON record (one per name) in Redis. Every time is in milliseconds since
the epoch, like the run API. ``next_run_at`` is also the job's score in the due index, and is
``None`` whenever the job cannot fire (paused, disabled, a one-shot that ran, expired).

A job runs as the agent that made it (``agent``), at its creator's trust (``trust``), with
no more tools than the creating turn had (``allowed_tools``): its runs get that agent's
prompt, route, policy classes and tool list (``fermix_shared.agents.definitions.as_agent``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from fermix_shared.agents.definitions import DEFAULT_AGENT
from fermix_shared.models import ConversationKey, Trust
from fermix_shared.records import VersionedRecord
from fermix_shared.scheduling import cron

# 2: the job's agent. A reader that ignored it would run the job as ``default`` (another
# prompt, route and tool set), so older readers refuse it; version 1 records (made before
# jobs had an agent) read as ``default``'s, as they ran then.
SCHEMA_VERSION = 2
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 3600.0
MAX_MESSAGE_CHARS = 20_000
# How much of a run's answer (or error) its history entry keeps.
OUTPUT_EXCERPT_CHARS = 500

ScheduleKind = Literal["cron", "every", "at"]
DeliveryStatus = Literal["none", "silent", "sent", "failed", "stored"]
Trigger = Literal["schedule", "catch_up", "manual"]


def now_ms() -> int:
    return int(time.time() * 1000)


def ms_to_iso(ms: int | None) -> str:
    """``2026-03-08T07:30:00Z`` (or ``-``) for listings."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Schedule(BaseModel):
    """When a job fires: a cron expression in a time zone, a fixed interval, or once."""

    kind: ScheduleKind
    cron: str | None = None
    tz: str = "UTC"
    every_s: int | None = Field(default=None, ge=1)
    at: int | None = None

    def following(self, after_ms: int) -> int | None:
        """The schedule's first time strictly after ``after_ms`` (None for a one-shot)."""
        if self.kind == "cron" and self.cron:
            after = datetime.fromtimestamp(after_ms / 1000, UTC)
            return int(cron.next_after(self.cron, self.tz, after).timestamp() * 1000)
        if self.kind == "every" and self.every_s:
            return after_ms + self.every_s * 1000
        return None

    def next_due(self, anchor_ms: int, now_ms: int) -> int | None:
        """The first time strictly after ``now_ms`` in the cadence that had a run at
        ``anchor_ms`` (intervals keep their phase; cron times are fixed anyway)."""
        if self.kind == "every" and self.every_s:
            step = self.every_s * 1000
            return anchor_ms + step * (max(0, now_ms - anchor_ms) // step + 1)
        return self.following(max(anchor_ms, now_ms))

    def describe(self) -> str:
        if self.kind == "cron":
            return f"cron {self.cron} ({self.tz})"
        if self.kind == "every":
            return f"every {self.every_s}s"
        return f"at {ms_to_iso(self.at)}"


class Delivery(BaseModel):
    """Where a run's answer goes: nowhere (``none``; the run record keeps it), back to the
    conversation that created the job (``origin``), or a channel target (``target``)."""

    mode: Literal["none", "origin", "target"] = "none"
    to: ConversationKey | None = None

    def describe(self) -> str:
        if self.to is None:
            return "none"
        k = self.to
        return f"{k.channel}:{k.chat_id}" + ("" if k.thread_scope == "root" else f":{k.thread_scope}")


class Job(VersionedRecord):
    """One scheduled job (see the module docstring for the time unit)."""

    SCHEMA_VERSION = SCHEMA_VERSION

    name: str = Field(pattern=NAME_PATTERN)
    # The agent whose turns run the job (fermix_shared/agents/definitions.py): a ``main`` agent.
    agent: str = DEFAULT_AGENT
    schedule: Schedule
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    delivery: Delivery = Field(default_factory=Delivery)
    # None = what the agent allows at the creator's trust; [] = no tools; [names] = exactly
    # those (within the agent's limits too).
    allowed_tools: list[str] | None = None
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    trust: Trust = "operator"
    created_by: str = "cli"
    created_at: int = Field(default_factory=now_ms)
    enabled: bool = True
    paused: bool = False
    disabled_reason: str | None = None
    expires_at: int | None = None
    consecutive_failures: int = 0
    next_run_at: int | None = None
    last_run_at: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_version(cls, data: Any) -> Any:
        """As VersionedRecord's, and a version 1 record (no agent yet) is read as a job of
        ``default``."""
        if not isinstance(data, dict):
            return data
        version = data.get("schema_version", SCHEMA_VERSION)
        if version == 1 and "agent" not in data:
            return {**data, "schema_version": SCHEMA_VERSION, "agent": DEFAULT_AGENT}
        if version != SCHEMA_VERSION:
            raise ValueError(f"Job schema_version {version} is not {SCHEMA_VERSION}; refusing")
        return {**data, "schema_version": version}

    @property
    def state(self) -> str:
        if not self.enabled:
            return f"disabled ({self.disabled_reason})" if self.disabled_reason else "disabled"
        return "paused" if self.paused else "active"

    def next_due(self, anchor_ms: int, now_ms: int) -> int | None:
        """:meth:`Schedule.next_due`, or None past the expiry (and for a one-shot)."""
        nxt = self.schedule.next_due(anchor_ms, now_ms)
        if nxt is not None and self.expires_at is not None and nxt >= self.expires_at:
            return None
        return nxt


class JobRun(BaseModel):
    """One entry of a job's run history (newest first, capped)."""

    run_id: str
    status: Literal["ok", "error", "stopped"]
    trigger: Trigger = "schedule"
    scheduled_for: int | None = None
    started_at: int | None = None
    ended_at: int
    output: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    delivery: DeliveryStatus = "none"


def first_run(job: Job, now: int) -> int | None:
    """When a new (or resumed) job fires first: the one-shot time, else the next after now;
    None when that is past the job's expiry."""
    nxt = job.schedule.at if job.schedule.kind == "at" else job.schedule.following(now)
    if nxt is not None and job.expires_at is not None and nxt >= job.expires_at:
        return None
    return nxt
