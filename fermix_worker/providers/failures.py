"""What the user is told when a provider error ends the turn, and short reasons for events."""

from __future__ import annotations

import math

from fermix_shared.errors import (
    AllProvidersFailed,
    BudgetCutOff,
    ProviderError,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    ProviderUnavailable,
)


def _minutes(seconds: float) -> int:
    """Whole minutes, rounded up so the user is never told to come back too early."""
    return max(1, math.ceil(seconds / 60))


def failure_message(err: ProviderError) -> str:
    """The user-facing reply for a terminal provider error.

    * rate limit or quota with a reset time:
      ``You’ve hit your {provider} usage limit. Try again in ~{N} min.``. This also holds when
      the chain is exhausted and its last hop failed that way (the seed: a rate-limit error is
      terminal when "the chain is exhausted").
    * rate limit, no reset time:
      ``{provider} is rate-limiting requests right now. Please try again in a minute.``
    * quota, no reset time:
      ``Your {provider} quota is used up. Check the plan and billing, then try again.``
    * unreachable / timed out / connection broke:
      ``I couldn't reach the model provider ({provider}): {detail}``
    * every route of a multi-route chain failed:
      ``All model providers failed ({p1}: {reason}; {p2}: {reason}). Please try again in a
      moment.``
    * anything else: ``The model provider failed: {detail}``
    """
    if isinstance(err, BudgetCutOff):  # already the user's words
        return str(err)
    if isinstance(err, AllProvidersFailed):
        last = err.failures[-1][1]
        if isinstance(last, ProviderRateLimited) and last.retry_after:
            return failure_message(last)
        names = [e.provider for _, e in err.failures]
        if len(set(names)) < len(names):  # the same provider twice: name the routes
            names = [route for route, _ in err.failures]
        reasons = "; ".join(
            f"{name}: {short_reason(e)}" for name, (_, e) in zip(names, err.failures, strict=True)
        )
        return f"All model providers failed ({reasons}). Please try again in a moment."
    if isinstance(err, ProviderRateLimited):
        if err.retry_after:
            minutes = _minutes(err.retry_after)
            return f"You’ve hit your {err.provider} usage limit. Try again in ~{minutes} min."
        if isinstance(err, ProviderQuotaExceeded):
            return (
                f"Your {err.provider} quota is used up. Check the plan and billing, then try again."
            )
        return f"{err.provider} is rate-limiting requests right now. Please try again in a minute."
    if isinstance(err, ProviderUnavailable):
        return f"I couldn't reach the model provider ({err.provider}): {err}"
    return f"The model provider failed: {err}"


def short_reason(err: ProviderError) -> str:
    """A few words on why a call failed, for events and the all-routes-failed message."""
    if isinstance(err, AllProvidersFailed):
        return "all routes failed"
    if isinstance(err, ProviderRateLimited):
        what = "quota used up" if isinstance(err, ProviderQuotaExceeded) else "rate-limited"
        if err.retry_after:
            return f"{what}, resets in ~{_minutes(err.retry_after)} min"
        return what
    if isinstance(err, ProviderUnavailable):
        if err.timeout:
            return "timed out"
        return "connection broke" if err.bytes_received else "unreachable"
    if err.status is not None:
        return "overloaded (HTTP 529)" if err.status == 529 else f"HTTP {err.status}"
    return "failed"
