"""Fermix's exception tree, split by who must act.

    FermixError
     +-- ConfigError            the operator must fix configuration (bad TOML, missing key)
     +-- UserInputError         the caller sent something we refuse (bad request, unknown run)
     +-- ProviderError          the LLM provider failed; `transient` says whether a retry may help
     |    +-- ProviderUnavailable   connection refused/reset, DNS, timeouts before any byte
     |    +-- ProviderRateLimited   429 / quota; `retry_after` seconds when the provider said
     +-- ControlSignal          not failures: the turn must stop (cancelled, lease lost)
          +-- TurnCancelled
          +-- LeaseLost

A failing *tool* is never an exception that escapes the loop: it becomes a tool result.
"""

from __future__ import annotations


class FermixError(Exception):
    """Root of every error Fermix raises on purpose."""


class ConfigError(FermixError):
    """Configuration is missing or invalid; the operator must fix it."""


class UserInputError(FermixError):
    """The caller sent something Fermix refuses."""


class ProviderError(FermixError):
    """An LLM provider call failed."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int | None = None,
        transient: bool = False,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.transient = transient


class ProviderUnavailable(ProviderError):
    """The provider could not be reached, or timed out before answering."""


class ProviderRateLimited(ProviderError):
    """The provider refused for rate or quota reasons."""

    def __init__(self, message: str, *, provider: str, retry_after: float | None = None) -> None:
        super().__init__(message, provider=provider, status=429, transient=False)
        self.retry_after = retry_after


class ControlSignal(FermixError):
    """Not a failure: the running turn must stop now."""


class TurnCancelled(ControlSignal):
    """The turn was cancelled (e.g. /stop)."""


class LeaseLost(ControlSignal):
    """This worker no longer holds the conversation's lease; it must not deliver or commit."""
