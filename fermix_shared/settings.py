"""Settings: environment variables with the ``FERMIX_`` prefix, plus an optional TOML file.

Precedence (highest first): init arguments, environment, ``fermix.toml`` named by
``FERMIX_CONFIG``, defaults. The SDKs' own variables (``OPENAI_API_KEY``,
``ANTHROPIC_BASE_URL``, ...) are read by the SDKs themselves; we only look at whether a key is
present to pick a default provider.

Data and its validation only: what is done with a setting lives with the concept that owns it
(the provider chain in :mod:`fermix_shared.provider_routes`, the agents in
:mod:`fermix_shared.agents.definitions`, the replica wait in :mod:`fermix_shared.redis.replicas`,
a sender's trust in ``fermix_gateway.auth``, a channel's queue mode and streaming in
:mod:`fermix_shared.channels.modes`), so this module imports only data models that never
import it back (tests/test_layout.py holds the package to no import cycle).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.functional_validators import BeforeValidator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fermix_shared.agents.definitions import AgentDefinition, Binding, check_agents
from fermix_shared.audit.model import AuditConfig
from fermix_shared.mcp_config import McpServers
from fermix_shared.memory.config import MemoryConfig
from fermix_shared.models import Channel, PolicyClass, QueueMode
from fermix_shared.provider_routes import ProviderName, RouteConfig
from fermix_shared.recorder.config import RecorderConfig
from fermix_shared.redis.sentinel import check_pair, parse_sentinels
from fermix_shared.run_config import RunsConfig
from fermix_shared.settings_check import unknown_keys
from fermix_shared.usage.config import UsageConfig
from fermix_shared.usage.prices import ModelPrice

# How a chat reply appears while the model writes it: "partial" edits one message as the text
# grows, "block" sends finished paragraphs as they come, "off" sends it whole at the end.
StreamingMode = Literal["off", "partial", "block"]


class CompactionConfig(BaseModel):
    """``[compaction]`` in fermix.toml (env ``FERMIX_COMPACTION__THRESHOLD``, ...)."""

    enabled: bool = True
    # Compact when a turn's provider-reported prompt tokens reach this share of the window.
    threshold: float = Field(default=0.85, gt=0.1, le=1.0)
    # Recent user turns kept verbatim after a compaction.
    keep_turns: int = Field(default=4, ge=1, le=50)
    # Seconds a conversation waits after a failed compaction before trying again (seed: 60).
    backoff_seconds: float = 60.0


class LoopGuardConfig(BaseModel):
    """``[loop_guard]`` in fermix.toml (env ``FERMIX_LOOP_GUARD__WINDOW``, ...).

    The loop guard's thresholds (fermix_worker/guard.py); defaults are the seed's. The window
    and the ping-pong history are checkpointed with every step, hence their upper bounds.
    """

    model_config = ConfigDict(extra="forbid")

    # Repeats of one call (same tool, same arguments) among the `window` most recent calls.
    window: int = Field(default=10, ge=1, le=1000)
    warn_at: int = Field(default=3, ge=2)
    kill_at: int = Field(default=5, ge=3)
    # Calls alternating between two signatures (A B A B ...).
    pingpong_warn: int = Field(default=4, ge=3)
    pingpong_kill: int = Field(default=8, ge=4, le=1000)
    # Tool calls in one turn before it is stopped.
    max_tool_calls: int = Field(default=250, ge=1)
    # One tool called this many times in a row, any arguments (OpenFang's
    # max_same_tool_streak): a warning only.
    streak_warn: int = Field(default=5, ge=2)

    @model_validator(mode="after")
    def _kill_above_warn(self) -> LoopGuardConfig:
        if self.kill_at <= self.warn_at:
            raise ValueError(f"kill_at ({self.kill_at}) must be greater than warn_at ({self.warn_at})")
        if self.kill_at > self.window:
            raise ValueError(
                f"kill_at ({self.kill_at}) must not exceed window ({self.window}): "
                "repeats could never reach it"
            )
        if self.pingpong_kill <= self.pingpong_warn:
            raise ValueError(
                f"pingpong_kill ({self.pingpong_kill}) must be greater than "
                f"pingpong_warn ({self.pingpong_warn})"
            )
        return self


class LimitsConfig(BaseModel):
    """``[limits]`` in fermix.toml (env ``FERMIX_LIMITS__MAX_BODY_BYTES``, ...): what the
    gateway accepts. Defaults sit far above what a person sends (docs/configuration.md, "Limits")."""

    model_config = ConfigDict(extra="forbid")

    # Request bodies past this are refused (413) before they are read whole.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Characters in one message (chat or /v1/agent).
    max_text_chars: int = Field(default=32_000, ge=1)
    # Messages waiting in one conversation behind its running turn (0 = no cap).
    max_queued_per_conversation: int = Field(default=100, ge=0)
    # Messages one sender (``channel:user``; on /v1/agent the chatId) may queue per minute,
    # in a burst or spread out (0 = no limit). Commands such as /stop are never limited.
    sender_messages_per_minute: int = Field(default=30, ge=0)


class ApprovalsConfig(BaseModel):
    """``[approvals]`` in fermix.toml (env ``FERMIX_APPROVALS__TIMEOUT_SECONDS``, ...): which
    tool calls wait for a person (fermix_worker/approvals/policy.py)."""

    model_config = ConfigDict(extra="forbid")

    # Calls of tools in these policy classes need approval ([] = none by class).
    policies: list[PolicyClass] = Field(default_factory=lambda: list[PolicyClass](["exec"]))
    # And these tools by name, whatever their class.
    tools: list[str] = Field(default_factory=list)
    # No answer within this many seconds denies the call.
    timeout_seconds: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)


class TaintConfig(BaseModel):
    """``[taint]`` in fermix.toml (env ``FERMIX_TAINT__MODE``, ...): what a turn that has read
    untrusted content may still do (fermix_worker/approvals/taint.py)."""

    model_config = ConfigDict(extra="forbid")

    # approval: such calls wait for a person; refuse: they are refused; off: no check.
    mode: Literal["approval", "refuse", "off"] = "approval"
    # The policy classes gated once the turn is tainted.
    policies: list[PolicyClass] = Field(
        default_factory=lambda: list[PolicyClass](["exec", "read_write"]))


class Settings(BaseSettings):
    """Every knob Fermix reads. Field ``x`` is env ``FERMIX_X`` or key ``x`` in fermix.toml."""

    model_config = SettingsConfigDict(env_prefix="FERMIX_", extra="ignore", env_nested_delimiter="__")

    redis_url: str = "redis://127.0.0.1:6379/0"
    # Redis through Sentinel: ``host:port,...`` and the master's name, both or neither; the
    # URL then gives only db and password. An accepted message (and a worker's mark before a
    # platform send) waits (WAIT) for replicas: ``auto`` (unset with Sentinel) one while the
    # primary has one connected, none while it has none; ``N`` strict (short is a 503); unset
    # without Sentinel: 0 (fermix_shared/redis/replicas.py).
    redis_sentinels: Annotated[list[tuple[str, int]], NoDecode, BeforeValidator(parse_sentinels)
                               ] = Field(default_factory=list)
    redis_master: str | None = None
    redis_wait_replicas: Annotated[int, Field(ge=0, le=16)] | Literal["auto"] | None = None
    # At most 1.5 s: under the gateway's 2 s socket timeout (a slower WAIT would be dropped).
    redis_wait_timeout_ms: int = Field(default=500, ge=1, le=1500)
    home: Path = Field(default_factory=lambda: Path.home() / ".fermix")
    api_token: SecretStr | None = None
    # The web console at /console (fermix_gateway/console/); FERMIX_CONSOLE=off leaves it out.
    console: bool = True
    gateway_url: str = "http://127.0.0.1:8080"

    provider: ProviderName | None = None
    model: str | None = None
    # Seconds: connect timeout and whole-call read timeout for provider calls. A provider that
    # never answers ends the run as an error instead of hanging a worker slot forever.
    provider_connect_timeout: float = 10.0
    provider_timeout: float = 120.0
    max_tokens: int = 4096
    # Prompt caching: Anthropic calls carry cache_control breakpoints (system prompt, history,
    # newest message; fermix_worker/providers/anthropic_cache.py). OpenAI caches on its own.
    prompt_cache: bool = True
    # The provider chain, primary first (``[[routes]]`` tables); empty means the single route
    # from ``provider``/``model`` above. See fermix_shared/provider_routes.py.
    routes: list[RouteConfig] = Field(default_factory=list)

    # Channels. Telegram calls go to {telegram_api_base}/bot{token}/{method}; Slack calls to
    # {slack_api_base}/{method}.
    telegram_bot_token: SecretStr | None = None
    telegram_webhook_secret: SecretStr | None = None
    telegram_api_base: str = "https://api.telegram.org"
    # Bot username (without @) for /command@botname and mentions; looked up with getMe if unset.
    telegram_bot_username: str | None = None
    # In groups, answer only when mentioned or replied to (private chats always answer).
    telegram_group_mention_only: bool = True
    slack_bot_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    slack_api_base: str = "https://slack.com/api"
    # Slack bot user id (U...), to ignore our own messages; looked up with auth.test if unset.
    slack_bot_user_id: str | None = None
    # Replies appear while they are written (see fermix_worker/turn/live_reply.py).
    telegram_streaming: StreamingMode = "partial"
    slack_streaming: StreamingMode = "partial"
    # "channel:user_id" entries: owners get operator trust, allowed users guest trust, anyone
    # else is dropped (and logged). Comma-separated in the environment.
    owner_ids: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_ids: Annotated[list[str], NoDecode] = Field(default_factory=list)

    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    loop_guard: LoopGuardConfig = Field(default_factory=LoopGuardConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    # What run streams carry: tool details only when verbose (fermix_shared/run_config.py).
    runs: RunsConfig = Field(default_factory=RunsConfig)
    taint: TaintConfig = Field(default_factory=TaintConfig)
    # Audit trail retention (fermix_shared/audit/model.py).
    audit: AuditConfig = Field(default_factory=AuditConfig)
    # The flight recorder: each run's model calls and tool results, for replay and fork
    # (fermix_shared/recorder/).
    recorder: RecorderConfig = Field(default_factory=RecorderConfig)
    # Context window (tokens) for models the catalog does not know; `context_windows` in TOML
    # overrides the catalog per model id.
    context_window: int | None = Field(default=None, gt=0)
    context_windows: dict[str, int] = Field(default_factory=dict)
    # Model prices in USD per million tokens over the built-in catalog (``[prices."model-id"]``
    # in TOML, FERMIX_PRICES as JSON), and how usage is counted and budgets warn (``[usage]``).
    # See fermix_shared/usage/.
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    usage: UsageConfig = Field(default_factory=UsageConfig)

    system_prompt: str = (
        "You are Fermix, a helpful assistant. Answer concisely. Use tools when they help."
    )
    # Named agents (``[[agents]]``) and what chooses them (``[[bindings]]``); see
    # fermix_shared/agents/definitions.py. Without any, every message goes to the built-in ``default``.
    agents: list[AgentDefinition] = Field(default_factory=list)
    bindings: list[Binding] = Field(default_factory=list)
    # MCP servers whose tools the agent may use (``[[mcp_servers]]``; fermix_shared/mcp_config.py).
    mcp_servers: McpServers = Field(default_factory=list)
    # Seconds a worker's claim on a conversation stays valid without renewal: a dead worker's
    # turn is noticed within this (plus one reaper interval).
    lease_seconds: float = Field(default=30.0, gt=0, le=30.0)
    # A turn whose worker died resumes from its checkpoint on another worker; this many
    # attempts in all, then the user gets the generic error.
    turn_max_attempts: int = Field(default=3, ge=1, le=10)
    # Every worker process writes a heartbeat this often (seconds). A process silent for
    # `worker_dead_seconds` (at least three heartbeats) is dead: the reaper resumes its turns
    # and re-runs its subagents then, without waiting for a lease or the broker. The margin
    # keeps a slow but live worker (a GC pause, a busy event loop) from losing its work.
    worker_heartbeat_seconds: float = Field(default=1.0, gt=0, le=10.0)
    worker_dead_seconds: float = Field(default=5.0, gt=0, le=60.0)
    # On SIGTERM a worker takes no new turns and gives those in flight this long to finish;
    # then it hands the rest over: they resume at once on another worker from their checkpoint.
    worker_shutdown_grace: float = Field(default=25.0, ge=0, le=600.0)
    # How often a running turn renews its lease and looks for /stop (seconds).
    cancel_poll_seconds: float = 0.5
    # Queue mode for every conversation, unless its channel or the conversation sets one.
    queue_mode: QueueMode = "followup"
    queue_modes: dict[Channel, QueueMode] = Field(default_factory=dict)
    # Redis transport: an unacked task is redelivered after this long. Turns never rely on it
    # (a redelivered dispatch finds the conversation busy), but keep it above most turns.
    broker_visibility_timeout: int = 3600
    # Every turn's wall-clock deadline in seconds (FERMIX_TURN_TIMEOUT; 0 = none): past it the
    # turn is stopped and ends ``error`` with a reply that says so. Our own deadline, enforced
    # by the loop and the lease keeper: Celery time limits do not work in every pool.
    turn_timeout: float = Field(default=600.0, ge=0)
    # Seconds one tool call may run unless its tool sets its own; then it is abandoned and
    # the model gets an error result.
    tool_timeout_seconds: float = Field(default=120.0, gt=0)
    # The directory the file tools and run_command are confined to (an agent's `workspace`
    # overrides it; neither set: the tools are not offered), and one subdirectory of it per
    # conversation when asked. See fermix_worker/tools/workspace.py.
    workspace: Path | None = None
    workspace_per_conversation: bool = False
    # run_command's sandbox (fermix_worker/tools/sandbox.py): auto and bwrap = bubblewrap, and
    # no run_command where it cannot run (the tool is not offered); none = never sandboxed
    # (a clean environment, no capabilities, its own pid namespace where possible).
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    # run_command: the most seconds one command may run (its timeout argument is capped at
    # this), the output characters kept (head and tail), the memory of the whole command in
    # MiB, its processes at once, and the size of its private /tmp in MiB (bwrap's tmpfs).
    # Memory and processes bind the whole command through a cgroup where the host allows it
    # (fermix_worker/tools/cgroups.py); command_cgroup names a cgroup v2 directory to create
    # the commands' cgroups in (default: found from the worker's own cgroup).
    command_timeout_seconds: float = Field(default=60.0, gt=0, le=600.0)
    command_output_chars: int = Field(default=12_000, ge=1000, le=19_000)
    command_memory_mb: int = Field(default=4096, ge=64)
    command_processes: int = Field(default=512, ge=16)
    command_tmp_mb: int = Field(default=512, ge=1)
    command_cgroup: Path | None = None
    # Wall-clock bound of one subagent worker (seed: 300 s default, 900 s hard maximum).
    subagent_timeout_seconds: float = Field(default=300.0, gt=0, le=900.0)
    history_limit: int = 200
    # Turns one worker process carries at once (gevent greenlets); pools are sized from it.
    worker_concurrency: int = 100
    # Memory review, coalesced per conversation: one review (one model call) covers every
    # operator turn since the last, once the conversation has been quiet this long, or at
    # once when this many turns wait (fermix_worker/tasks/memory.py).
    memory_review_quiet_seconds: float = Field(default=30.0, ge=0)
    memory_review_batch_turns: int = Field(default=10, ge=1, le=100)
    # Which facts join a turn's prompt: the top 5 by relevance (fermix_shared/memory/config.py).
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    # Seconds one plugin hook may take before its result is discarded (the turn goes on).
    hook_timeout_seconds: float = Field(default=5.0, gt=0)
    # Prometheus endpoint of a worker process (one process per port); unset: none. Keep the
    # address on loopback unless a firewall stands between it and the internet.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    # Every role's log lines: "text", or "json" (one object per line; fermix_shared/logs.py).
    log_format: Literal["text", "json"] = "text"

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        check_agents(self.agents, self.bindings)
        check_pair(self.redis_sentinels, self.redis_master)
        return self

    @field_validator(
        "api_token", "telegram_bot_token", "telegram_webhook_secret", "slack_bot_token",
        "slack_signing_secret", mode="before",
    )
    @classmethod
    def _empty_token_is_none(cls, v: Any) -> Any:
        return None if v == "" else v

    @field_validator("owner_ids", "allowed_ids", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [x.strip() for x in v.split(",") if x.strip()]
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_path = os.environ.get("FERMIX_CONFIG")
        if config_path:
            path = Path(config_path)
            if not path.is_file():
                from fermix_shared.errors import ConfigError

                raise ConfigError(f"FERMIX_CONFIG points at {path}, which is not a file")
            toml = TomlConfigSettingsSource(settings_cls, toml_file=path)
            unknown_keys(toml.toml_data, settings_cls, str(path))  # settings_check.py
            sources.append(toml)
        return tuple(sources)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings, read once."""
    return Settings()
