"""Translate both SDKs' exceptions into Fermix's provider errors (the SDKs share a shape)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from fermix_shared.errors import (
    ProviderContextOverflow,
    ProviderError,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    ProviderUnavailable,
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Reset headers: Anthropic sends RFC 3339 instants, OpenAI durations like "1m30s" or "20ms".
_RESET_HEADERS = (
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)


def _seconds_until(value: str, now: float) -> float | None:
    """A header value as seconds from ``now``: plain seconds, a duration, or an instant."""
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    parts = _DURATION.findall(value)
    if parts and "".join(n + u for n, u in parts) == value:
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    try:
        instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            instant = parsedate_to_datetime(value)  # Retry-After may be an HTTP date
        except (TypeError, ValueError):
            return None
    if instant.tzinfo is None:
        return None
    return instant.timestamp() - now


def retry_after(headers: Any, now: Callable[[], float] = time.time) -> float | None:
    """Seconds until the provider says a refused request may be retried, or None.

    ``retry-after-ms`` and ``retry-after`` win; otherwise the latest of the rate-limit reset
    headers (so the user is never told to come back too early).
    """
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    t = now()
    plain = headers.get("retry-after")
    if plain and (seconds := _seconds_until(plain, t)) is not None and seconds >= 0:
        return seconds
    resets = [
        s for name in _RESET_HEADERS
        if (v := headers.get(name)) and (s := _seconds_until(v, t)) is not None and s >= 0
    ]  # fmt: skip
    return max(resets) if resets else None


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _is_httpx(exc: BaseException, class_name: str) -> bool:
    """Matched by name so it holds for both ``httpx`` and the SDKs' ``httpx2`` fork."""
    return any(
        c.__name__ == class_name and c.__module__.split(".")[0] in ("httpx", "httpx2")
        for c in type(exc).__mro__
    )


def is_transport_error(exc: BaseException) -> bool:
    """An HTTP transport failure the SDK let through unwrapped (anthropic does mid-stream)."""
    return _is_httpx(exc, "TransportError")


def is_timeout(exc: BaseException, sdk: Any) -> bool:
    """The SDK's timeout error, or a transport timeout anywhere in the exception's chain."""
    return any(
        isinstance(e, sdk.APITimeoutError) or _is_httpx(e, "TimeoutException")
        for e in _exception_chain(exc)
    )


def is_quota_error(exc: Any) -> bool:
    """Billing, not pacing: OpenAI ``insufficient_quota``, Anthropic ``billing_error``/402 or
    the "credit balance is too low" refusal."""
    status = getattr(exc, "status_code", None)
    kind = {getattr(exc, "code", None), getattr(exc, "type", None)}
    message = str(getattr(exc, "message", "") or "").lower()
    return (
        status == 402
        or bool(kind & {"insufficient_quota", "billing_error"})
        or "credit balance" in message
    )


_OVERFLOW = re.compile(
    r"context.length|maximum context|prompt is too long|too many tokens|context window",
    re.IGNORECASE,
)


def translate(exc: Exception, provider: str, sdk: Any, *, received: bool = False) -> ProviderError:
    """Map an ``openai``/``anthropic`` SDK exception (or a raw transport error) onto ours.

    ``received`` is the adapter's measurement: had the first streamed event arrived?
    """
    if is_timeout(exc, sdk):
        return ProviderUnavailable(
            f"{provider} did not answer in time", provider=provider,
            timeout=True, bytes_received=received,
        )  # fmt: skip
    if is_transport_error(exc) or isinstance(exc, sdk.APIConnectionError):
        verb = "the connection to {p} broke" if received else "could not connect to {p}"
        return ProviderUnavailable(
            f"{verb.format(p=provider)}: {exc}", provider=provider, bytes_received=received
        )
    if isinstance(exc, sdk.APIStatusError):
        headers = exc.response.headers
        if is_quota_error(exc):
            return ProviderQuotaExceeded(
                f"{provider} quota exhausted: {exc.message}", provider=provider,
                retry_after=retry_after(headers), status=exc.status_code,
            )  # fmt: skip
        if exc.status_code in (400, 413) and _OVERFLOW.search(str(exc.message)):
            return ProviderContextOverflow(
                f"{provider}: the prompt is too long for the model: {exc.message}",
                provider=provider, status=exc.status_code,
            )
        if isinstance(exc, sdk.RateLimitError):
            return ProviderRateLimited(
                f"{provider} rate limit: {exc.message}",
                provider=provider,
                retry_after=retry_after(headers),
            )
        return ProviderError(
            f"{provider} returned HTTP {exc.status_code}: {exc.message}",
            provider=provider,
            status=exc.status_code,
            # 500, 502, 503, 504, 529 overloaded; Anthropic's mid-stream error events arrive
            # on a 200 response and say what they are in ``type``.
            transient=exc.status_code >= 500
            or getattr(exc, "type", None) in ("overloaded_error", "api_error"),
        )
    return ProviderError(f"{provider} call failed: {exc}", provider=provider)
