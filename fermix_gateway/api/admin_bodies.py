"""Response bodies of the admins' and operators' registries: named API tokens, scheduled jobs
(``/v1/schedules``, and as ``/v1/status`` lists them) and the skill registry (``/v1/skills``,
and as ``/v1/status`` lists it). Times in ms since the epoch."""

from __future__ import annotations

from typing import Literal

from fermix_gateway.api.wire import Body, Number
from fermix_shared.access.tokens import Role
from fermix_shared.models import Trust
from fermix_shared.scheduling.jobs import DeliveryStatus, Trigger
from fermix_shared.skills.parse import SkillRoot


class Skill(Body):
    """A skill of the registry."""

    name: str
    description: str
    trust: Trust
    root: SkillRoot


class SkillIssue(Body):
    """A skill file that could not be loaded, and why."""

    source: str
    root: SkillRoot
    error: str


class ScheduleShown(Body):
    """A scheduled job as ``/v1/status`` lists it: the agent and trust it runs as, its
    schedule and state described, its next run (or null), where its answer goes."""

    name: str
    agent: str
    trust: Trust
    schedule: str
    state: str
    nextRunAt: int | None
    delivery: str


class Token(Body):
    """A named API token: never its secret, only its last 4 characters (``hint``)."""

    name: str
    role: Role
    createdAt: int
    createdBy: str
    hint: str


class NewToken(Token):
    """``POST /v1/tokens``, 201: the token's secret, shown this once."""

    token: str


class Tokens(Body):
    """``GET /v1/tokens``."""

    tokens: list[Token]


class TokenRevoked(Body):
    """``DELETE /v1/tokens/{name}``."""

    revoked: Token


class JobRun(Body):
    """One run of a scheduled job."""

    runId: str
    status: Literal["ok", "error", "stopped"]
    trigger: Trigger
    scheduledFor: int | None
    startedAt: int | None
    endedAt: int
    output: str
    inputTokens: int
    outputTokens: int
    delivery: DeliveryStatus


class Job(ScheduleShown):
    """A scheduled job with its newest runs (``GET /v1/schedules``, and the answer of each
    change)."""

    lastRunAt: int | None
    paused: bool
    consecutiveFailures: int
    runs: list[JobRun]


class JobDetail(Job):
    """``GET /v1/schedules/{name}``: the job, its task and limits, its whole kept history."""

    message: str
    allowedTools: list[str] | None
    timeoutS: Number
    createdBy: str
    createdAt: int
    expiresAt: int | None
    disabledReason: str | None


class JobStarted(Job):
    """``POST /v1/schedules/{name}/run``, 202: the job and the run it queued."""

    runId: str


class Jobs(Body):
    """``GET /v1/schedules``: every job by name."""

    schedules: list[Job]


class JobRemoved(Body):
    """``DELETE /v1/schedules/{name}``."""

    removed: str


class RegistrySkill(Skill):
    """A skill as ``GET /v1/skills`` lists it: with its source file."""

    source: str


class SkillRegistry(Body):
    """``GET /v1/skills``, ``POST /v1/skills/reload``: the registry as of ``version``."""

    version: str
    skills: list[RegistrySkill]
    issues: list[SkillIssue]

