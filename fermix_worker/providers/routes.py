"""Provider routes: the SDK clients and adapters behind each hop of the configured chain
(the chain itself, :func:`chain_from_settings`, is in ``fermix_shared.provider_routes``).

Clients are shared per process, one per distinct (provider, base URL, API key): the SDKs keep
connection pools. A route's own read timeout is applied per request, so routes that differ only
in timeout or model share a client.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from fermix_shared.errors import ConfigError
from fermix_shared.provider_routes import ProviderRoute, chain_from_settings
from fermix_shared.settings import Settings
from fermix_worker.providers.base import Provider

_SDK_KEY_ENV: dict[str, str] = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_SDK_URL_ENV: dict[str, str] = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}

_lock = threading.RLock()
_clients: dict[tuple[str, str | None, str | None], Any] = {}

# The chain and its naming are pure and live in fermix_shared (the gateway reports them too);
# re-exported here, where the worker has always found them.
__all__ = ["ProviderRoute", "adapter_for", "chain_from_settings", "client_for"]


def _key_for(route: ProviderRoute) -> str | None:
    if route.api_key_env is None:
        return os.environ.get(_SDK_KEY_ENV[route.provider]) or None
    key = os.environ.get(route.api_key_env)
    if not key:
        raise ConfigError(
            f"provider route {route.name}: environment variable {route.api_key_env} "
            "(its API key) is not set"
        )
    return key


def _sdk(provider: str) -> Any:
    """The provider's SDK module (anthropic imported only when a route needs it, ~1-2 s).
    Each SDK's own ``Timeout`` goes with its client: the two may be built on different HTTP
    libraries (httpx, its httpx2 fork), whose timeout objects do not mix."""
    if provider == "anthropic":
        import anthropic

        return anthropic
    import openai

    return openai


def client_for(route: ProviderRoute, settings: Settings) -> Any:
    """The process-wide SDK client for the route's (provider, base URL, key).

    Raises ConfigError when the key is missing or the SDK refuses to build a client.
    """
    key = _key_for(route)
    base_url = route.base_url or os.environ.get(_SDK_URL_ENV[route.provider]) or None
    cache_key = (route.provider, base_url, key)
    with _lock:
        if cache_key not in _clients:
            sdk = _sdk(route.provider)
            timeout = sdk.Timeout(settings.provider_timeout,
                                  connect=settings.provider_connect_timeout)
            make = sdk.Anthropic if route.provider == "anthropic" else sdk.OpenAI
            # max_retries=0: retries are the router's to decide (it knows whether content
            # already reached the user).
            try:
                _clients[cache_key] = make(
                    api_key=key, base_url=base_url, timeout=timeout, max_retries=0
                )
            except Exception as e:  # the SDKs raise their own base error types
                raise ConfigError(f"cannot create the {route.provider} client: {e}") from e
        return _clients[cache_key]


def adapter_for(route: ProviderRoute, settings: Settings) -> Provider:
    """The adapter for one route, over the shared client, with the route's read timeout."""
    client = client_for(route, settings)
    timeout = None
    if route.timeout is not None:
        timeout = _sdk(route.provider).Timeout(route.timeout,
                                               connect=settings.provider_connect_timeout)
    if route.provider == "anthropic":
        from fermix_worker.providers.anthropic import AnthropicProvider

        return AnthropicProvider(client, timeout=timeout, prompt_cache=settings.prompt_cache)
    from fermix_worker.providers.openai import OpenAIProvider

    return OpenAIProvider(client, timeout=timeout)


def route_spec(settings: Settings, model: str) -> str:
    """``provider/model`` for a model someone named (a fork's or an eval's): as given when it
    names its provider, else a model of the configured primary's. ValueError with a sentence
    when the provider is not one Fermix speaks."""
    spec = model if "/" in model else f"{chain_from_settings(settings)[0].provider}/{model}"
    provider, _, name = spec.partition("/")
    if provider not in ("anthropic", "openai") or not name:
        raise ValueError(f"the model {model!r} is not 'anthropic/...', 'openai/...' or a model "
                         "of the configured provider")
    return spec
