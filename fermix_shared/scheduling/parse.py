"""Parse, then act: user input (CLI arguments, agent tool arguments) into a valid job.

Every refusal is a :class:`UserInputError` with one sentence saying what is wrong.
"""

from __future__ import annotations

import re
from datetime import datetime

from fermix_shared.agents.definitions import DEFAULT_AGENT, AgentDefinition
from fermix_shared.errors import UserInputError
from fermix_shared.models import ConversationKey, Trust
from fermix_shared.scheduling import cron
from fermix_shared.scheduling.jobs import (
    DEFAULT_TIMEOUT_S,
    MAX_MESSAGE_CHARS,
    MAX_TIMEOUT_S,
    NAME_PATTERN,
    Delivery,
    Job,
    Schedule,
    now_ms,
)


def check_name(name: str) -> str:
    if not re.match(NAME_PATTERN, name):
        raise UserInputError(
            f"job name {name!r} must be 1-64 characters of letters, digits, '_', '.' or '-'")
    return name


def parse_target(raw: str) -> ConversationKey:
    """``CHANNEL:CHAT_ID[:THREAD]`` (telegram or slack) as a conversation key."""
    channel, _, rest = raw.partition(":")
    chat_id, _, thread = rest.partition(":")
    if channel not in ("telegram", "slack") or not chat_id:
        raise UserInputError(
            f"delivery target {raw!r} must be telegram:CHAT_ID[:THREAD] or slack:CHANNEL[:THREAD_TS]")
    thread = thread or "root"
    if not (ConversationKey.valid_part(chat_id) and ConversationKey.valid_part(thread)):
        raise UserInputError(f"delivery target {raw!r} has an invalid chat or thread id")
    if channel == "telegram" and not re.fullmatch(r"-?\d+", chat_id):
        raise UserInputError(f"a Telegram chat id is a number, not {chat_id!r}")
    return ConversationKey(channel=channel, chat_id=chat_id, thread_scope=thread)  # type: ignore[arg-type]


def parse_time(raw: str, tz_name: str = "UTC") -> int:
    """An ISO-8601 time (``2026-03-08T09:00``, with an offset or ``Z``, else in ``tz_name``)."""
    try:
        dt = datetime.fromisoformat(raw.strip())
    except ValueError as e:
        raise UserInputError(f"{raw!r} is not an ISO-8601 time such as 2026-03-08T09:00:00Z") from e
    if dt.tzinfo is None:
        try:
            dt = dt.replace(tzinfo=cron.zone(tz_name))
        except cron.CronError as e:
            raise UserInputError(str(e)) from e
    return int(dt.timestamp() * 1000)


def make_schedule(
    *, cron_expr: str | None = None, tz: str | None = None, every_s: int | None = None,
    at: str | None = None, now: int | None = None,
) -> Schedule:
    """Validate exactly one of cron / every / at (raises :class:`UserInputError`)."""
    given = [x for x in (cron_expr, every_s, at) if x is not None]
    if len(given) != 1:
        raise UserInputError("give exactly one schedule: a cron expression, an interval or a time")
    if tz is not None and cron_expr is None and at is None:
        raise UserInputError("a time zone only applies to a cron expression or a one-shot time")
    zone = tz or "UTC"
    try:
        cron.zone(zone)
        if cron_expr is not None:
            cron.validate(cron_expr, zone)
            return Schedule(kind="cron", cron=cron_expr.strip(), tz=zone)
    except cron.CronError as e:
        raise UserInputError(str(e)) from e
    if every_s is not None:
        if every_s < 1:
            raise UserInputError(f"the interval must be at least 1 second, not {every_s}")
        return Schedule(kind="every", every_s=every_s)
    when = parse_time(str(at), zone)
    if when <= (now if now is not None else now_ms()):
        raise UserInputError(f"{at} is in the past")
    return Schedule(kind="at", at=when, tz=zone)


def check_agent(name: str, agents: list[AgentDefinition]) -> str:
    """A job's agent: ``default`` or a declared ``main`` agent (``agents``: the
    ``[[agents]]`` entries); a ``sub`` agent only runs for another agent (``skill_run``)."""
    if name == DEFAULT_AGENT:
        return name
    found = next((a for a in agents if a.name == name), None)
    if found is None:
        raise UserInputError(
            f"no agent named {name!r} is declared (`fermix agents list` shows the agents)")
    if found.role != "main":
        raise UserInputError(
            f"agent {name!r} is a 'sub' agent: a job runs as a 'main' agent")
    return name


def parse_delivery(raw: str | None, origin: ConversationKey | None) -> Delivery:
    """``none``, ``origin`` (the creating conversation) or ``CHANNEL:CHAT_ID[:THREAD]``."""
    value = (raw or "none").strip()
    if value == "none":
        return Delivery()
    if value == "origin":
        if origin is None:
            raise UserInputError("there is no originating conversation to deliver to here")
        return Delivery(mode="origin", to=origin)
    return Delivery(mode="target", to=parse_target(value))


def new_job(
    *, name: str, message: str, schedule: Schedule, delivery: Delivery, trust: Trust,
    created_by: str, allowed_tools: list[str] | None = None, timeout_s: float | None = None,
    expires_at: str | None = None, max_timeout_s: float = MAX_TIMEOUT_S, now: int | None = None,
    agent: str = DEFAULT_AGENT,
) -> Job:
    """A validated job (raises :class:`UserInputError` with one sentence). ``agent`` is
    checked by the caller (:func:`check_agent`), which knows the configured agents."""
    check_name(name)
    if not message.strip():
        raise UserInputError("the job's message (its task prompt) is empty")
    if len(message) > MAX_MESSAGE_CHARS:
        raise UserInputError(f"the job's message is longer than {MAX_MESSAGE_CHARS} characters")
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    # max_timeout_s is the turn timeout; 0 means turns have none, so only the job cap holds.
    limit = min(max_timeout_s or MAX_TIMEOUT_S, MAX_TIMEOUT_S)
    if not 0 < timeout <= limit:
        raise UserInputError(f"the timeout must be above 0 and at most {limit:g} seconds, not {timeout:g}")
    t = now if now is not None else now_ms()
    expires = parse_time(expires_at, schedule.tz) if expires_at else None
    if expires is not None and expires <= t:
        raise UserInputError(f"the expiry {expires_at} is in the past")
    return Job(name=name, agent=agent, schedule=schedule, message=message, delivery=delivery,
               allowed_tools=allowed_tools, timeout_s=min(timeout, limit), trust=trust,
               created_by=created_by, created_at=t, expires_at=expires)
