"""``[usage]`` in fermix.toml (env ``FERMIX_USAGE__WARN_AT``, ...), beside ``[prices]``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class UsageConfig(BaseModel):
    """How usage is counted and budgets warn."""

    model_config = ConfigDict(extra="forbid")

    # Count every model call's usage (turning it off also turns budgets off: nothing is spent).
    enabled: bool = True
    # Share of a budget at which its conversation is warned, once per scope and period.
    warn_at: float = Field(default=0.8, gt=0, lt=1)
