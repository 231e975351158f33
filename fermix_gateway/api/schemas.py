"""Request and response bodies of the run API (camelCase on the wire, as DESIGN.md says)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fermix_gateway.bodies import is_id, is_text
from fermix_shared.models import ConversationKey, RunRecord


class AgentRequest(BaseModel):
    """``POST /v1/agent``. Strict types: ``true`` is no chat id."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Its length limit is a setting (limits.max_text_chars), checked by the route.
    message: str
    chatId: str | int = "default"
    threadScope: str | None = None
    profile: Literal["default", "ultra"] = "default"
    # Optional idempotency key: the same messageId in the same chat runs one turn.
    messageId: str | None = Field(default=None, min_length=1, max_length=200)
    # The agent to answer (a declared `main` agent); unset: the bindings choose, else default.
    agent: str | None = Field(default=None, min_length=1, max_length=64)
    # Tool details (arguments, results) on the run's stream; unset: the operator's
    # ``[runs] verbose`` (fermix_shared/run_config.py).
    verbose: bool | None = None

    @field_validator("message", "messageId")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is not None and not is_text(v):
            raise ValueError("must be Unicode text (a lone surrogate is not)")
        return v

    @field_validator("message")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("message must not be empty")
        return v

    @field_validator("chatId", mode="before")
    @classmethod
    def _str_or_int(cls, v: object) -> object:
        # One reason, not one per member of the union (and no bool: it is an int to Python).
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise ValueError("must be a string or an integer")
        return v

    @field_validator("chatId", "threadScope")
    @classmethod
    def _safe_id(cls, v: str | int | None) -> str | None:
        if v is None:
            return None
        v = str(v)
        if not is_id(v):
            raise ValueError("must be 1-200 characters without whitespace or '|'")
        return v


def ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def conversation_json(key: ConversationKey) -> dict[str, str]:
    return {"channel": key.channel, "chatId": key.chat_id, "threadScope": key.thread_scope}


def run_json(rec: RunRecord) -> dict[str, Any]:
    """``GET /v1/runs/{id}``: optional fields appear only when set."""
    out: dict[str, Any] = {
        "runId": rec.run_id,
        "status": rec.status.value,
        "conversation": conversation_json(rec.conversation),
        "acceptedAt": ms(rec.accepted_at),
    }
    for name, value in (
        ("reply", rec.reply),
        ("error", rec.error),
        ("startedAt", ms(rec.started_at)),
        ("endedAt", ms(rec.ended_at)),
        ("mergedInto", rec.merged_into),
        ("worker", rec.worker),
        ("traceId", rec.trace_id),
    ):
        if value is not None:
            out[name] = value
    return out


def wait_json(rec: RunRecord, timed_out: bool) -> dict[str, Any]:
    """``GET /v1/runs/{id}/wait``: the Fased ``agent.wait`` shape."""
    out: dict[str, Any] = {
        "runId": rec.run_id,
        "status": "timeout" if timed_out else rec.status.value,
        "startedAt": ms(rec.started_at),
        "endedAt": ms(rec.ended_at),
    }
    if rec.error and not timed_out:
        out["error"] = rec.error
    if rec.reply is not None and not timed_out:
        out["reply"] = rec.reply
    return out
