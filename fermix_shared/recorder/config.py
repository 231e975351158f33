"""``[recorder]``: how long a run's record is kept and how large it may grow."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RecorderConfig(BaseModel):
    """The flight recorder's settings (``[recorder]`` in TOML, ``FERMIX_RECORDER__*``).

    ``enabled``: record every turn's model requests and responses and tool results (on by
    default: replay and fork need it). ``keep_days``: how long a record is kept after its last
    write. ``max_bytes``: a run's record stops growing here (a ``cut`` entry marks where; a
    replay checks the steps before it)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    keep_days: float = Field(default=7.0, gt=0, le=365)
    max_bytes: int = Field(default=4_000_000, ge=10_000, le=100_000_000)

    @property
    def ttl_s(self) -> int:
        return max(1, int(self.keep_days * 86400))
