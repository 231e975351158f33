"""Fermix's exception tree, split by who must act.

Every exception Fermix defines is drawn here, under :class:`FermixError`: its name, ``[a
second base]`` callers also catch it as, the module that defines it (``fermix_`` left out;
none for this module) and when it is raised. ``tests/shared/test_errors.py`` imports every
module of fermix_shared, fermix_worker, fermix_gateway and fermix_cli and holds each exception
to its place in this drawing.

    FermixError                   every error Fermix raises on purpose
     +-- ConfigError              the operator must fix configuration (bad TOML, missing key)
     +-- UserInputError           the caller (a user, an API client, the model) sent something
     |    |                       Fermix refuses
     |    +-- BadRequest [ValueError]          gateway.api.openai_schemas
     |    |       an OpenAI-compatible request cannot be served as asked (400, OpenAI's shape)
     |    +-- MalformedBody [ValueError]       gateway.bodies
     |    |       a webhook or API body is not what the route expects (400)
     |    +-- BodyTooLarge [HTTPException]     gateway.body_limit
     |    |       a request body over FERMIX_LIMITS__MAX_BODY_BYTES (413)
     |    +-- CronError [ValueError]           shared.scheduling.cron
     |    |       a cron expression or a time zone is invalid
     |    +-- JobNotFound                      shared.scheduling.store
     |    |       no scheduled job has that name
     |    +-- JobExists                        shared.scheduling.store
     |    |       a job of that name exists, and replacing it was not asked for
     |    +-- SkillParseError [ValueError]     shared.skills.parse
     |    |       a SKILL.md cannot be used (skipped when scanned, refused when created)
     |    +-- SkillExists                      shared.skills.registry
     |    |       a skill is created under a name the registry has, without replace
     |    +-- MemoryRefused                    shared.memory.fact
     |    |       a memory change is refused (empty, too long, memory full, unknown fact)
     |    +-- TokenRefused                     shared.access.tokens
     |    |       an API token cannot be made or revoked as asked (`status`: 422, 409, 404)
     |    +-- ArgsError                        worker.subagents.tool
     |    |       a subagents or skill_run call the fan-out refuses; the model reads why
     |    +-- ForkError [ValueError]           worker.recorder.fork
     |    |       a fork cannot start as asked (a bad step, agent, model or prompt; 422)
     |    +-- SuiteError [ValueError]          shared.evals.suite
     |    |       an eval suite file cannot be read or is not a suite (the key at fault)
     |    +-- NotACase [ValueError]            shared.evals.from_run
     |    |       a run's record cannot be made an eval case (no start; 422)
     |    +-- EvalError [ValueError]           worker.evals.run
     |            an eval case cannot run as asked (an unknown agent or model; 422)
     +-- ProviderError            the LLM provider failed; `transient` says whether a retry may help
     |    +-- ProviderUnavailable   connection refused/reset, DNS, transport timeout/close;
     |    |                         `timeout` and `bytes_received` say what the adapter measured
     |    +-- ProviderRateLimited   429; `retry_after` seconds when the provider said
     |    |    +-- ProviderQuotaExceeded   quota/credit used up (billing, not pacing)
     |    +-- ProviderContextOverflow   the prompt no longer fits the model's context window
     |    +-- AllProvidersFailed    every route of a multi-route chain failed; `failures`
     |    +-- BudgetCutOff          a budget has no room for the next call, which is not made;
     |                              the message is the user's reply
     +-- ControlSignal            not failures: the turn must stop (cancelled, lease lost)
     |    +-- TurnCancelled       the turn was cancelled (e.g. /stop)
     |    +-- LeaseLost           this worker no longer holds the conversation's lease: it must
     |    |    |                  not deliver or commit
     |    |    +-- HandedOff                   worker.turn.lease
     |    |            the worker shuts down: the turn resumes on another from its checkpoint
     |    +-- TurnTimedOut        the turn passed its wall-clock deadline (FERMIX_TURN_TIMEOUT)
     |    |    +-- JobTimedOut    a scheduled job's run passed the job's own timeout
     |    +-- SubagentTimedOut                 worker.subagents.watch
     |            a subagent's wall-clock budget ran out
     +-- ChannelError                          shared.channels.base
     |    |   sending to a platform failed after the adapter's own retries
     |    +-- RateLimited                      shared.channels.base
     |    |       the platform said wait `retry_after` seconds (429); nothing was changed
     |    +-- TelegramError                    shared.channels.telegram_api
     |            a Bot API call failed (`ok: false`, or no answer came)
     +-- ToolError                             worker.tools.base
     |        a tool failed; its message is the tool result the model reads, as-is
     +-- CallTimedOut                          worker.interrupt
     |        a tool call passed its time bound and was abandoned
     +-- McpFailure                            worker.mcp.sessions
     |        (MCP host process) a listing or a call failed; the message is the model's error
     +-- _SessionEnded                         worker.mcp.sessions
     |        an MCP server refused the session (HTTP 404): the request is retried on a new one
     +-- McpUnavailable                        worker.mcp.bridge
     |        (worker) the MCP host did not answer a request; the message is the model's error
     +-- _TooLong                              worker.tools.web_text
     |        html2text wrote more than its bound: the page is shown by the next converter
     +-- CompactionFailed                      worker.compaction.conversation
     |        the summary call failed; the conversation is unchanged and compaction backs off
     +-- NotReplicated [RedisError]            shared.redis.durability
     |        fewer replicas than asked acknowledged a write in time (the gateway answers 503)
     +-- ReplyLost [ConnectionError]           shared.redis.client
     |        the connection dropped after a command that must not run twice (never retried)
     +-- AlertNotDelivered                     worker.usage.alerts
     |        the budget-alert webhook did not take an alert; `retry` says whether to try again
     +-- BrokenAnchor                          shared.audit.store
     |        audit retention stopped at an entry that is missing or unreadable
     +-- Diverged                              worker.recorder.standins
     |        a replayed turn left its record here (the step's report says how)
     +-- ClientError                           cli.client
     |    |   a CLI failure, reported as one sentence (exit 1)
     |    +-- GatewayRefused                   cli.client
     |            the gateway answered a CLI request with an error status
     +-- _TelegramRefused                      cli.doctor.channels
              `fermix doctor`: the Bot API refused a check, or gave no usable answer

Outside the tree, on purpose:

    Interrupted [BaseException]                worker.interrupt
            thrown into a blocked greenlet; it must pass the ``except Exception`` of the code
            it interrupts, and the armed region turns it into a ControlSignal
    ScriptedConnectionDrop                     dev.scripted_llm._connection
            the scripted model server's order to drop a connection (dev tooling: Fermix code
            never sees it, only the dropped connection)

A second base is kept so that code catching the standard error still catches ours: a
ValueError raised in a pydantic validator becomes a validation error, FastAPI's body parsing
lets only an HTTPException through unchanged, and redis-py's retries and the gateway's 503
handler act on Redis errors.

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


class BudgetCutOff(ProviderError):
    """A budget has no room for the next model call's worst case: the call is not made and
    the turn ends with this message (which budget, and when it resets) as its reply."""

    def __init__(self, message: str) -> None:
        super().__init__(message, provider="budget")


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
