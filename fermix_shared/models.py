"""The data model shared by gateway and worker: conversation keys, inbound messages, runs."""

from __future__ import annotations

import re
import time
import uuid
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fermix_shared.records import VersionedRecord

# ``schedule``: a scheduled job's run, one isolated conversation per run.
Channel = Literal["http", "telegram", "slack", "schedule", "console"]
RunProfile = Literal["default", "ultra"]
QueueMode = Literal["followup", "collect", "steer", "interrupt", "reject"]
# Who is asking: operators (API token holders, owners) or guests (allowed users).
Trust = Literal["operator", "guest"]
# What a tool does, for policy (fermix_worker/tools/policy.py): guests get ``read_only`` only.
PolicyClass = Literal["read_only", "read_write", "exec", "network", "external_api", "gui_control"]


def lower_trust(a: Trust, b: Trust) -> Trust:
    """The lesser of two trusts: an agent or a skill never raises its caller's."""
    return "operator" if a == b == "operator" else "guest"

_SAFE = re.compile(r"^[^\s|]{1,200}$")


class ConversationKey(BaseModel):
    """``{channel, chat_id, thread_scope}``: the unit of FIFO scheduling and history."""

    model_config = ConfigDict(frozen=True)

    channel: Channel
    chat_id: str
    thread_scope: str = "root"

    def as_str(self) -> str:
        """Stable string form used inside Redis key names: ``channel|chat_id|thread_scope``."""
        return f"{self.channel}|{self.chat_id}|{self.thread_scope}"

    @classmethod
    def parse(cls, raw: str) -> ConversationKey:
        channel, chat_id, thread_scope = raw.split("|", 2)
        return cls(channel=channel, chat_id=chat_id, thread_scope=thread_scope)  # type: ignore[arg-type]

    @staticmethod
    def valid_part(value: str) -> bool:
        """Chat ids and thread scopes: 1-200 chars, no whitespace, no ``|``."""
        return bool(_SAFE.match(value))


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    ok = "ok"
    error = "error"
    stopped = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.ok, RunStatus.error, RunStatus.stopped)


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex


def now() -> float:
    return time.time()


class InboundMessage(VersionedRecord):
    """One accepted user message waiting in a conversation's inbox."""

    run_id: str = Field(default_factory=new_run_id)
    key: ConversationKey
    text: str
    sender_id: str = "api"
    trust: Trust = "operator"
    profile: RunProfile = "default"
    accepted_at: float = Field(default_factory=now)
    # The platform's id of the user's message (Telegram message_id, Slack ts): what the
    # working indicator reacts to.
    reply_to: str | None = None
    # Scheduled runs: the loop context (iteration cap), where the answer goes (None: only the
    # run record), the job's tool subset (None: the trust default), the job's name, its
    # timeout (s) and the occurrence it fires for (ms; None for "run now").
    context: Literal["interactive", "scheduled"] = "interactive"
    deliver_to: ConversationKey | None = None
    allowed_tools: list[str] | None = None
    job: str | None = None
    timeout_s: float | None = None
    scheduled_for: int | None = None
    # "compact": not a user message but a compaction to run in the conversation's order
    # (after a turn crossed the threshold, or /compact); `compact_reason` says which.
    kind: Literal["message", "compact"] = "message"
    compact_reason: Literal["auto", "command"] | None = None
    # A post-turn compaction job: the turn it follows, whose run stream gets its events.
    follows_run: str | None = None
    # Tool details (arguments, results) on the run's stream: the request's choice
    # (``POST /v1/agent`` ``verbose``), None for the operator's ``[runs] verbose``.
    verbose: bool | None = None
    # The agent (fermix_shared/agents/definitions.py) that answers: chosen at accept time by the message's
    # `agent` field or the bindings, and part of the turn's snapshot from then on.
    agent: str = "default"
    # The accept span's W3C trace context (``{"traceparent": ...}``; fermix_shared/tracing.py):
    # the worker's spans of this turn join its trace. None with tracing off at the gateway.
    trace: dict[str, str] | None = None


class RunRecord(VersionedRecord):
    """What ``GET /v1/runs/{id}`` shows; stored as one JSON value per run."""

    run_id: str
    status: RunStatus = RunStatus.queued
    conversation: ConversationKey
    accepted_at: float = Field(default_factory=now)
    started_at: float | None = None
    ended_at: float | None = None
    reply: str | None = None
    error: str | None = None
    worker: str | None = None
    # Set when this run's message was merged into another run's turn (collect, steer).
    merged_into: str | None = None
    # Scheduled runs with a delivery target: "sent", "failed" or "stored" (no push channel).
    delivery: Literal["sent", "failed", "stored"] | None = None
    # The turn's trace (32 hex digits) when tracing is on: set at accept from the message's
    # carried context, or by the worker when the turn's span starts.
    trace_id: str | None = None
