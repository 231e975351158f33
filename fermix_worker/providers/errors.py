"""Translate both SDKs' exceptions into Fermix's provider errors (the SDKs share a shape)."""

from __future__ import annotations

from typing import Any

from fermix_shared.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
)


def _retry_after(headers: Any) -> float | None:
    for name in ("retry-after", "anthropic-ratelimit-requests-reset", "x-ratelimit-reset-requests"):
        value = headers.get(name) if headers is not None else None
        if value:
            try:
                return float(value)
            except ValueError:
                continue
    return None


def is_transport_error(exc: BaseException) -> bool:
    """An HTTP transport failure the SDK let through unwrapped (anthropic does mid-stream).

    Matched by name so it holds for both ``httpx`` and the SDKs' ``httpx2`` fork.
    """
    return any(
        c.__name__ == "TransportError" and c.__module__.split(".")[0] in ("httpx", "httpx2")
        for c in type(exc).__mro__
    )


def translate(exc: Exception, provider: str, sdk: Any) -> ProviderError:
    """Map an ``openai``/``anthropic`` SDK exception (or a raw transport error) onto ours."""
    if is_transport_error(exc):
        return ProviderUnavailable(
            f"the connection to {provider} broke: {exc}", provider=provider, transient=True
        )
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderUnavailable(
            f"{provider} did not answer in time", provider=provider, transient=True
        )
    if isinstance(exc, sdk.APIConnectionError):
        return ProviderUnavailable(
            f"could not connect to {provider}: {exc}", provider=provider, transient=True
        )
    if isinstance(exc, sdk.RateLimitError):
        return ProviderRateLimited(
            f"{provider} rate limit: {exc.message}",
            provider=provider,
            retry_after=_retry_after(exc.response.headers),
        )
    if isinstance(exc, sdk.APIStatusError):
        return ProviderError(
            f"{provider} returned HTTP {exc.status_code}: {exc.message}",
            provider=provider,
            status=exc.status_code,
            transient=exc.status_code >= 500,
        )
    return ProviderError(f"{provider} call failed: {exc}", provider=provider)
