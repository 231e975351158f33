"""Provider adapters, one per file, and the factory that builds the configured one.

Clients are created lazily under a lock and reused: the SDKs keep connection pools.
"""

from __future__ import annotations

import threading

from fermix_shared.errors import ConfigError
from fermix_shared.settings import Settings
from fermix_worker.providers.base import ModelRequest, ModelTurn, Provider, ToolSpec

__all__ = ["ModelRequest", "ModelTurn", "Provider", "ToolSpec", "get_provider"]

_lock = threading.Lock()
_cache: dict[str, Provider] = {}


def _build(name: str, settings: Settings) -> Provider:
    import anthropic
    import openai

    timeout = openai.Timeout(settings.provider_timeout, connect=settings.provider_connect_timeout)
    # Retries are ours to decide (the loop knows whether content already reached the user).
    if name == "anthropic":
        from fermix_worker.providers.anthropic import AnthropicProvider

        return AnthropicProvider(anthropic.Anthropic(timeout=timeout, max_retries=0))
    from fermix_worker.providers.openai import OpenAIProvider

    return OpenAIProvider(openai.OpenAI(timeout=timeout, max_retries=0))


def get_provider(name: str, settings: Settings) -> Provider:
    """The process-wide adapter for ``name`` (``anthropic`` or ``openai``).

    Raises ConfigError when the SDK refuses to build a client (e.g. no API key).
    """
    if name not in _cache:
        with _lock:
            if name not in _cache:
                try:
                    _cache[name] = _build(name, settings)
                except Exception as e:  # the SDKs raise their own base error types
                    raise ConfigError(f"cannot create the {name} client: {e}") from e
    return _cache[name]
