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

With no routes, the chain is the single route from ``FERMIX_PROVIDER``/``FERMIX_MODEL``
(:func:`resolved_provider`, :func:`resolved_model`: unset, whichever SDK key is present and
that provider's default model). :func:`chain_from_settings` names each hop (``openai/gpt-4.1-mini``); it is pure, so the
gateway reports the same chain the workers use (``GET /v1/status``) without importing them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # settings imports this module for RouteConfig and ProviderName
    from fermix_shared.settings import Settings

ProviderName = Literal["anthropic", "openai"]

# A provider's model when none is configured.
DEFAULT_MODELS: dict[str, str] = {
    "anthropic": "claude-sonnet-4-5",
    "openai": "gpt-4.1-mini",
}


class RouteConfig(BaseModel):
    """One configured hop of the provider chain (validated at the settings edge)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: ProviderName
    model: str = Field(min_length=1)
    base_url: str | None = None
    # Name of the environment variable holding the API key (never the key itself); when
    # unset, the SDK's own variable (OPENAI_API_KEY / ANTHROPIC_API_KEY).
    api_key_env: str | None = None
    # Read timeout in seconds for this route; unset means Settings.provider_timeout.
    timeout: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class ProviderRoute:
    """One hop of the chain. ``name`` tells routes apart in events, messages and status
    (``openai/gpt-4.1-mini``, suffixed ``#2`` when the chain repeats a provider and model)."""

    name: str
    provider: ProviderName
    model: str
    base_url: str | None = None
    # The environment variable holding the key; None means the SDK's own variable.
    api_key_env: str | None = None
    # Read timeout in seconds; None means Settings.provider_timeout.
    timeout: float | None = None


def _named(routes: list[tuple[ProviderName, str, str | None, str | None, float | None]]
           ) -> list[ProviderRoute]:
    out: list[ProviderRoute] = []
    seen: set[str] = set()
    for i, (provider, model, base_url, key_env, timeout) in enumerate(routes):
        name = f"{provider}/{model}"
        if name in seen:
            name = f"{name}#{i + 1}"
        seen.add(name)
        out.append(ProviderRoute(name, provider, model, base_url, key_env, timeout))
    return out


def chain_from_settings(settings: Settings) -> list[ProviderRoute]:
    """``settings.routes`` in order, primary first; without any, the single route from
    FERMIX_PROVIDER and FERMIX_MODEL (key and base URL from the SDK's environment variables)."""
    if not settings.routes:
        return _named([(resolved_provider(settings), resolved_model(settings), None, None, None)])
    return _named([
        (r.provider, r.model, r.base_url, r.api_key_env, r.timeout) for r in settings.routes
    ])


def resolved_provider(settings: Settings) -> ProviderName:
    """The primary provider: explicit setting, else whichever SDK key is present."""
    if settings.provider:
        return settings.provider
    if os.environ.get("ANTHROPIC_API_KEY") and not os.environ.get("OPENAI_API_KEY"):
        return "anthropic"
    return "openai"


def resolved_model(settings: Settings) -> str:
    """The primary model: explicit setting, else the primary provider's default."""
    return settings.model or DEFAULT_MODELS[resolved_provider(settings)]
