"""Fermix's exception tree, split by who must act.

    FermixError
     +-- ConfigError            the operator must fix configuration (bad TOML, missing key)
     +-- UserInputError         the caller sent something we refuse (bad request, unknown run)
     +-- ProviderError          the LLM provider failed; `transient` says whether a retry may help
     |    +-- ProviderUnavailable   connection refused/reset, DNS, transport timeout/close;
     |    |                         `timeout` and `bytes_received` say what the adapter measured
     |    +-- ProviderRateLimited   429; `retry_after` seconds when the provider said
     |    |    +-- ProviderQuotaExceeded   quota/credit used up (billing, not pacing)
     |    +-- AllProvidersFailed    every route of a multi-route chain failed; `failures`
     +-- ControlSignal          not failures: the turn must stop (cancelled, lease lost)
          +-- TurnCancelled
          +-- LeaseLost
          +-- TurnTimedOut     the turn passed its wall-clock deadline (FERMIX_TURN_TIMEOUT)
               +-- JobTimedOut      a scheduled job's run passed the job's own timeout

A failing *tool* is never an exception that escapes the loop: it becomes a tool result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
    """The provider could not be reached, timed out, or the connection broke.

    ``timeout``: the call ended because a timeout expired. ``bytes_received``: response data
    (the first streamed event) had arrived before the failure. A continuation call is only
    re-issued after a timeout with nothing received.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        transient: bool = True,
        timeout: bool = False,
        bytes_received: bool = False,
    ) -> None:
        super().__init__(message, provider=provider, transient=transient)
        self.timeout = timeout
        self.bytes_received = bytes_received


class ProviderRateLimited(ProviderError):
    """The provider refused for rate reasons; ``retry_after`` seconds when it said when."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        retry_after: float | None = None,
        status: int = 429,
    ) -> None:
        super().__init__(message, provider=provider, status=status, transient=False)
        self.retry_after = retry_after


class ProviderQuotaExceeded(ProviderRateLimited):
    """The account's quota or credit is used up (OpenAI ``insufficient_quota``, Anthropic
    billing errors): waiting a minute will not help, paying or a new period will."""


class ProviderContextOverflow(ProviderError):
    """The prompt no longer fits the model's context window (compact, then retry)."""


def is_overflow(err: ProviderError) -> bool:
    """True for an overflow, also when it is the last failure of an exhausted chain."""
    if isinstance(err, ProviderContextOverflow):
        return True
    failures: Any = getattr(err, "failures", None)
    return bool(failures) and isinstance(failures[-1][1], ProviderContextOverflow)


class AllProvidersFailed(ProviderError):
    """Every route of a chain of more than one failed; ``failures`` is (route, error) in order."""

    def __init__(self, failures: Sequence[tuple[str, ProviderError]]) -> None:
        if not failures:
            raise ValueError("AllProvidersFailed needs at least one failure")
        detail = "; ".join(f"{route}: {err}" for route, err in failures)
        last = failures[-1][1]
        super().__init__(
            f"all {len(failures)} provider routes failed ({detail})",
            provider=last.provider,
            status=last.status,
            transient=any(err.transient for _, err in failures),
        )
        self.failures: tuple[tuple[str, ProviderError], ...] = tuple(failures)


class ControlSignal(FermixError):
    """Not a failure: the running turn must stop now."""


class TurnCancelled(ControlSignal):
    """The turn was cancelled (e.g. /stop)."""


class LeaseLost(ControlSignal):
    """This worker no longer holds the conversation's lease; it must not deliver or commit."""


TURN_TIMED_OUT = (
    "That took too long: I stopped working on it after {timeout:g} s. "
    "Please try again, or break the request into smaller steps."
)


class TurnTimedOut(ControlSignal):
    """The turn passed its wall-clock deadline; the run ends ``error`` and the message (the
    user's reply) says it took too long and was stopped."""

    def __init__(self, timeout_s: float, message: str | None = None) -> None:
        super().__init__(message or TURN_TIMED_OUT.format(timeout=timeout_s))
        self.timeout_s = timeout_s


class JobTimedOut(TurnTimedOut):
    """A scheduled job's run passed the job's timeout; the run ends ``error``."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s, f"The scheduled job timed out after {timeout_s:g} s.")
