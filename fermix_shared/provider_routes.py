"""``[[routes]]`` in fermix.toml: the provider chain, primary first, then fallbacks.

    [[routes]]
    provider = "anthropic"
    model = "claude-sonnet-4-5"
    api_key_env = "ANTHROPIC_API_KEY"   # optional: the env var holding the key

    [[routes]]
    provider = "openai"
    model = "gpt-4.1-mini"
    base_url = "https://gateway.example/v1"   # optional
    timeout = 60                              # optional read timeout, seconds

With no routes, the chain is the single route from ``FERMIX_PROVIDER``/``FERMIX_MODEL``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RouteConfig(BaseModel):
    """One configured hop of the provider chain (validated at the settings edge)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["anthropic", "openai"]
    model: str = Field(min_length=1)
    base_url: str | None = None
    # Name of the environment variable holding the API key (never the key itself); when
    # unset, the SDK's own variable (OPENAI_API_KEY / ANTHROPIC_API_KEY).
    api_key_env: str | None = None
    # Read timeout in seconds for this route; unset means Settings.provider_timeout.
    timeout: float | None = Field(default=None, gt=0)
