"""Provider adapters, one per file, the route chain, and the factories that build them.

``get_router(settings)`` is the process-wide :class:`RoutedProvider` over the configured chain
(``[[routes]]``, else FERMIX_PROVIDER/FERMIX_MODEL); ``get_provider(name, settings)`` is a bare
adapter (no retry, no failover). Both are built lazily under a lock, over SDK clients shared
per (provider, base URL, key).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fermix_shared.provider_routes import ProviderName
from fermix_shared.settings import Settings
from fermix_worker.providers.base import ModelRequest, ModelTurn, Provider, ToolSpec
from fermix_worker.providers.failures import failure_message
from fermix_worker.providers.routes import ProviderRoute, adapter_for, chain_from_settings
from fermix_worker.providers.routing import BoundRoute, OnEvent, RoutedProvider, Router, wall_sleep

__all__ = [
    "ModelRequest",
    "ModelTurn",
    "OnEvent",
    "Provider",
    "ProviderRoute",
    "RoutedProvider",
    "Router",
    "ToolSpec",
    "build_router",
    "failure_message",
    "get_provider",
    "get_router",
    "override_route",
]

_lock = threading.Lock()
_providers: dict[str, Provider] = {}
_routers: dict[tuple[object, ...], RoutedProvider] = {}


def get_provider(name: ProviderName, settings: Settings) -> Provider:
    """The process-wide bare adapter for ``name`` (``anthropic`` or ``openai``), keyed and
    addressed by the SDK's environment variables.

    Raises ConfigError when the SDK refuses to build a client (e.g. no API key).
    """
    if name not in _providers:
        with _lock:
            if name not in _providers:
                route = ProviderRoute(name, name, settings.model or "")
                _providers[name] = adapter_for(route, settings)
    return _providers[name]


def build_router(
    settings: Settings,
    routes: list[ProviderRoute] | None = None,
    *,
    sleep: Callable[[float], None] = wall_sleep,
    on_event: OnEvent | None = None,
) -> RoutedProvider:
    """A new router over ``routes`` (default: the settings' chain). Clients are still shared.

    Raises ConfigError when a route's key is missing or its SDK refuses to build a client.
    """
    chain = chain_from_settings(settings) if routes is None else routes
    bound = [BoundRoute(r, adapter_for(r, settings)) for r in chain]
    return RoutedProvider(bound, sleep=sleep, on_event=on_event)


def get_router(settings: Settings) -> RoutedProvider:
    """The process-wide router for the settings' chain. Use ``.for_turn(...)`` per turn.

    Raises ConfigError as :func:`build_router` does (nothing is cached then).
    """
    key = (
        tuple(chain_from_settings(settings)),
        settings.provider_timeout,
        settings.provider_connect_timeout,
        settings.prompt_cache,
    )
    if key not in _routers:
        with _lock:
            if key not in _routers:
                _routers[key] = build_router(settings)
    return _routers[key]


def override_route(settings: Settings, spec: str) -> BoundRoute:
    """The route for ``provider/model`` (a hook's override), keyed and addressed by the SDK's
    environment variables. Raises ConfigError for an unknown provider."""
    from fermix_shared.errors import ConfigError

    provider, _, model = spec.partition("/")
    if provider not in ("anthropic", "openai") or not model:
        raise ConfigError(f"before_model_resolve chose {spec!r}: not 'anthropic/...' or 'openai/...'")
    route = ProviderRoute(spec, provider, model)  # type: ignore[arg-type]
    return BoundRoute(route, adapter_for(route, settings))
