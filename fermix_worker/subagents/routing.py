"""The provider route of one fan-out's subagents.

Without ``model``/``provider`` arguments the subagents use the configured chain (primary and
fallbacks). With them, that call alone goes to one route: the given provider (else the
primary's) and model (else that provider's configured model, else its default), reusing the
configured route's base URL, key variable and timeout for that provider when there is one.
Every route's read timeout is capped at the subagent's remaining time, so a silent provider
cannot outlive the per-worker timeout.
"""

from __future__ import annotations

import dataclasses

from fermix_shared.provider_routes import DEFAULT_MODELS, ProviderName
from fermix_shared.settings import Settings
from fermix_worker.providers.routes import ProviderRoute, chain_from_settings


def subagent_routes(
    settings: Settings, provider: ProviderName | None, model: str | None, remaining_s: float
) -> list[ProviderRoute]:
    """The chain for a subagent with ``remaining_s`` seconds left."""
    chain = chain_from_settings(settings)
    if provider is not None or model is not None:
        name: ProviderName = provider or chain[0].provider
        base = next((r for r in chain if r.provider == name), None)
        chosen = model or (base.model if base is not None else DEFAULT_MODELS[name])
        if base is None:
            chain = [ProviderRoute(f"{name}/{chosen}", name, chosen)]
        else:
            chain = [dataclasses.replace(base, name=f"{name}/{chosen}", model=chosen)]
    cap = max(1.0, remaining_s)
    return [
        dataclasses.replace(r, timeout=min(r.timeout or settings.provider_timeout, cap))
        for r in chain
    ]
