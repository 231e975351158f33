"""``[usage]`` in fermix.toml (env ``FERMIX_USAGE__WARN_AT``, ...), beside ``[prices]``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from fermix_shared.usage.scopes import conversation_of


class UsageConfig(BaseModel):
    """How usage is counted and budgets warn."""

    model_config = ConfigDict(extra="forbid")

    # Count every model call's usage (turning it off also turns budgets off: nothing is spent).
    enabled: bool = True
    # Share of a budget at which its conversation is warned, once per scope and period.
    warn_at: float = Field(default=0.8, gt=0, lt=1)
    # Owners' alerts at warn_at and at a budget's cap, once per budget, period and threshold
    # (fermix_worker/usage/alerts.py): a message into this chat (``telegram:12345``,
    # ``slack:C042``, or ``channel|chat|thread``), and a POST of the alert as JSON to this URL,
    # signed with HMAC-SHA256 under ``alert_secret`` and retried with backoff (first wait
    # ``alert_retry_seconds``, doubling, ``alert_attempts`` in all).
    alert_chat: str | None = None
    alert_webhook: str | None = None
    alert_secret: SecretStr | None = None
    alert_retry_seconds: float = Field(default=10.0, gt=0, le=3600)
    alert_attempts: int = Field(default=6, ge=1, le=20)
    # At the cap of an agent's budget, also pause the agent (its messages queue) until an owner
    # resumes it (``fermix agents resume NAME``).
    pause_at_cap: bool = False
    # The token-rate breaker: every agent's tokens a minute unless its ``[[agents]]`` sets
    # ``tokens_per_minute`` (None: no limit; fermix_shared/usage/rate.py).
    agent_tokens_per_minute: int | None = Field(default=None, ge=1)

    @field_validator("alert_chat")
    @classmethod
    def _chat(cls, v: str | None) -> str | None:
        return conversation_of(v) if v else None

    @field_validator("alert_webhook")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v and not v.startswith(("https://", "http://")):
            raise ValueError(f"alert_webhook is an http(s) URL, not {v!r}")
        return v or None

    @model_validator(mode="after")
    def _signed(self) -> UsageConfig:
        if self.alert_webhook and not (self.alert_secret and self.alert_secret.get_secret_value()):
            raise ValueError("alert_webhook needs alert_secret: every alert is signed with it")
        return self
