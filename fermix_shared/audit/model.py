"""What one audit entry holds, and the ``[audit]`` settings.

An entry (stored as one JSON object, field order irrelevant):

``seq``, ``ts``, ``prev``, ``hash``
    the chain (see :mod:`fermix_shared.audit.chain`): position, Redis server time in ms, the
    previous entry's hash, this entry's hash.
``schema_version``
    1.
``kind``
    ``tool`` (an invocation), ``check`` (a capability or policy check, ``pass`` once per tool
    call it permits, before it runs, and ``fail`` for each refusal: trust, policy class,
    allowed tools, operator-only, owner-only command, plugin hook, a killed agent's message),
    ``trust`` (who an inbound message was taken to be from), ``memory`` (a read or write of
    long-term memory), ``agent`` (subagent and skill-run spawn and cancel, agent pause, resume
    and kill), ``approval`` (asked,
    approved, denied, expired, cancelled), ``admin`` (chat commands, schedule and skill
    changes).
``action``
    what, within the kind: the tool's name, ``/stop``, ``schedule.create``, ``asked``, ...
``outcome``
    ``ok`` / ``error`` for actions, ``pass`` / ``fail`` for checks and trust decisions.
``actor``
    who: ``telegram:123``, ``slack:U1``, ``http:api``, ``cli``, ``worker``, ``timeout``,
    ``subagent``.
``run``, ``conv``, ``agent``
    the run id, the conversation (``channel|chat|thread``) and the agent, ``""`` when none.
``detail``
    flat scalars: ``ms`` (duration), ``args_sha256`` / ``args_len`` (a tool call's
    arguments), ``text_sha256`` / ``text_len`` (a message), ``reason`` (a refusal's fixed
    wording), ids. Never an argument's value, a message's text or a secret: a text is kept
    as its sha256 (and length) only.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from fermix_shared.records import VersionedRecord

Kind = Literal["tool", "check", "trust", "memory", "agent", "approval", "admin"]
Outcome = Literal["ok", "error", "pass", "fail"]
Scalar = str | int | float | bool | None
KINDS: tuple[str, ...] = get_args(Kind)
OUTCOMES: tuple[str, ...] = get_args(Outcome)
# A detail string longer than this is kept as its sha256 ("sha256:<hex>"): detail is for ids,
# counts and fixed wording, and a long string is most likely content that must not be kept.
MAX_DETAIL_CHARS = 200
# Actions (a tool name the model made up, say) are cut to this many characters.
MAX_ACTION_CHARS = 80


class AuditEntry(VersionedRecord):
    """One entry as read back (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    ts: int
    prev: str
    hash: str
    kind: str
    action: str
    outcome: str
    actor: str
    run: str = ""
    conv: str = ""
    agent: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)


class AuditConfig(BaseModel):
    """``[audit]`` in fermix.toml (env ``FERMIX_AUDIT__MAX_ENTRIES``, ...): retention. The
    reaper drops the oldest entries past either limit and moves the chain's anchor to the last
    one dropped; ``fermix audit export`` first, for anything kept longer."""

    model_config = ConfigDict(extra="forbid")

    # Entries kept (0 = no count limit), strangers' refusals not counted (they go by age, see
    # fermix_shared/audit/refusals.py). An entry takes about 0.6 kB of Redis memory, so the
    # default cap holds about 60 MB.
    max_entries: int = Field(default=100_000, ge=0)
    # Days an entry is kept (0 = no age limit).
    max_age_days: float = Field(default=30.0, ge=0)
