"""Agent definitions and bindings: which agent answers a message, and how.

An :class:`AgentDefinition` is the seed's ("Agent definitions"): a name, a role (``main``
agents answer conversations; ``sub`` agents are ephemeral workers run through ``skill_run``),
the system prompt, provider routing, tool and policy limits, trust, bounds and the agents or
skills it may delegate to. They are declared in fermix.toml as ``[[agents]]`` tables; the
built-in ``default`` agent is today's settings (a ``[[agents]]`` named ``default`` overrides
its fields).

A :class:`Binding` (``[[bindings]]``) sends the messages of a channel, a chat or a thread to an
agent; the most specific match wins (thread, then chat, then channel; the first declared on a
tie), and a message no binding matches goes to ``default``. ``POST /v1/agent`` may name the
agent itself. The choice is made once, when the message is accepted, and travels with it
(``InboundMessage.agent``), so a turn resumed on another worker runs as the same agent.

The lookups take the declared lists (``settings.agents``, ``settings.bindings``): this module
is a data model the settings are built from, and never imports them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fermix_shared.models import (
    Channel,
    ConversationKey,
    InboundMessage,
    PolicyClass,
    Trust,
    lower_trust,
)
from fermix_shared.provider_routes import DEFAULT_MODELS

log = logging.getLogger(__name__)

DEFAULT_AGENT = "default"
AGENT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
AgentRole = Literal["main", "sub"]
ReasoningEffort = Literal["minimal", "low", "medium", "high"]
# Seconds an agent may go without a turn before it reports ``idle`` (OpenFang: 5 minutes).
IDLE_AFTER_SECONDS = 300.0


class AgentDefinition(BaseModel):
    """One agent. Unset fields (None) fall back to the settings, i.e. the ``default`` agent's
    behaviour; the seed's ``persistent`` is ``role == "main"``.

    ``allowed_tools``: ``None`` = the trust default, ``[]`` = no tools, ``[...]`` = exactly
    those (still within trust and policy). ``policy``: the policy classes it may use (within
    its trust). ``trust``: the most it may act with; a guest's message to an operator agent
    still runs as a guest. ``delegates``: the skills and ``sub`` agents it may ``skill_run``
    (``None`` = any it can see, ``[]`` = none). ``reasoning_effort`` is for ``sub`` agents
    only (the seed sets it through subagent routing, never for a main agent).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    role: AgentRole = "main"
    description: str = ""
    system_prompt: str | None = None
    provider: Literal["anthropic", "openai"] | None = None
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    reasoning_effort: ReasoningEffort | None = None
    allowed_tools: list[str] | None = None
    policy: list[PolicyClass] | None = None
    trust: Trust = "operator"
    max_iterations: int | None = Field(default=None, ge=1, le=100)
    # A main agent's turn bound; 0: none (Fased: "Explicit 0 means no practical timeout").
    timeout_seconds: float | None = Field(default=None, ge=0)
    delegates: list[str] | None = None
    # The directory its file tools and run_command work in (None: the `workspace` setting).
    workspace: Path | None = None
    # The model's reasoning on the run's ``thinking`` stream (Fased: "streamed reasoning text
    # when enabled"); off, reasoning still reaches the model's next call, not the stream.
    stream_thinking: bool = False
    # The token-rate breaker: at most this many tokens a minute for its calls, fleet-wide
    # (None: ``[usage] agent_tokens_per_minute``; fermix_shared/usage/rate.py).
    tokens_per_minute: int | None = Field(default=None, ge=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not AGENT_NAME_RE.match(v):
            raise ValueError("agent names are 1-64 lowercase letters, digits, '-' or '_'")
        return v

    @field_validator("model", "system_prompt")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return v if v is None or v.strip() else None

    @model_validator(mode="after")
    def _effort_for_sub_only(self) -> AgentDefinition:
        if self.reasoning_effort is not None and self.role != "sub":
            raise ValueError(f"agent {self.name!r}: reasoning_effort is for role 'sub' only")
        if self.timeout_seconds == 0 and self.role == "sub":
            raise ValueError(f"agent {self.name!r}: a 'sub' agent's timeout_seconds must be > 0 "
                             "(it runs within its parent's fan-out deadline)")
        return self

    @property
    def persistent(self) -> bool:
        return self.role == "main"

    @property
    def fingerprint(self) -> str:
        """A digest of the definition as declared (the fields set to other than their
        defaults, so a release that adds a field changes no agent's): a kill is recorded
        against it, and a definition declared again with any change is a new agent."""
        declared = self.model_dump(mode="json", exclude_defaults=True)
        canonical = json.dumps(declared, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def route(self, primary_provider: str, primary_model: str) -> str | None:
        """``provider/model`` when this agent answers on another route than the configured
        primary (a provider without a model uses the primary's model name only when the
        provider is the same; otherwise that provider's default model); else None."""
        if self.provider is None and self.model is None:
            return None
        provider = self.provider or primary_provider
        if self.model:
            model = self.model
        elif provider == primary_provider:
            model = primary_model
        else:
            model = DEFAULT_MODELS[provider]
        if (provider, model) == (primary_provider, primary_model):
            return None
        return f"{provider}/{model}"


class Binding(BaseModel):
    """``[[bindings]]``: messages of ``channel`` (and ``chat``, and ``thread``) go to
    ``agent``. At least one of the three must be set; ``chat`` and ``thread`` need
    ``channel`` (ids are only unique within a platform)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    channel: Channel | None = None
    chat: str | None = None
    thread: str | None = None

    @field_validator("chat", "thread", mode="before")
    @classmethod
    def _id(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v

    @model_validator(mode="after")
    def _scoped(self) -> Binding:
        if self.channel is None:
            raise ValueError(f"a binding to {self.agent!r} needs a channel")
        if self.thread is not None and self.chat is None:
            raise ValueError(f"a binding to {self.agent!r} by thread needs its chat too")
        return self

    def matches(self, key: ConversationKey) -> bool:
        return (
            self.channel == key.channel
            and (self.chat is None or self.chat == key.chat_id)
            and (self.thread is None or self.thread == key.thread_scope)
        )

    @property
    def specificity(self) -> int:
        return 1 + (self.chat is not None) + (self.thread is not None)


def bound_agent(bindings: list[Binding], key: ConversationKey) -> str:
    """The agent bound to ``key``: the most specific matching binding, else ``default``."""
    best: Binding | None = None
    for b in bindings:
        if b.matches(key) and (best is None or b.specificity > best.specificity):
            best = b
    return best.agent if best else DEFAULT_AGENT


def agent_named(agents: list[AgentDefinition], name: str) -> AgentDefinition | None:
    """The agent called ``name`` (``default`` always exists), or None."""
    for a in agents:
        if a.name == name:
            return a
    return AgentDefinition(name=DEFAULT_AGENT) if name == DEFAULT_AGENT else None


def turn_agent(agents: list[AgentDefinition], name: str) -> AgentDefinition:
    """The agent a queued message names; ``default`` when it is no longer declared (the
    configuration changed after the message was accepted), with a warning."""
    agent = agent_named(agents, name)
    if agent is None:
        log.warning("agent %r is not declared any more; running its message as %r",
                    name, DEFAULT_AGENT)
        agent = agent_named(agents, DEFAULT_AGENT) or AgentDefinition(name=DEFAULT_AGENT)
    return agent


def agent_names(agents: list[AgentDefinition]) -> list[str]:
    """Every agent, ``default`` first, then as declared."""
    names = [DEFAULT_AGENT]
    names += [a.name for a in agents if a.name != DEFAULT_AGENT]
    return names


def check_agents(agents: list[AgentDefinition], bindings: list[Binding]) -> None:
    """Names are unique, and every binding names a ``main`` agent (``default`` included).
    Raises ValueError with the first problem."""
    seen: dict[str, AgentDefinition] = {}
    for a in agents:
        if a.name in seen:
            raise ValueError(f"agent {a.name!r} is declared twice")
        seen[a.name] = a
    if (d := seen.get(DEFAULT_AGENT)) is not None and d.role != "main":
        raise ValueError("the default agent must have role 'main'")
    for b in bindings:
        target = seen.get(b.agent)
        if target is None and b.agent != DEFAULT_AGENT:
            raise ValueError(f"a binding names agent {b.agent!r}, which is not declared")
        if target is not None and target.role != "main":
            raise ValueError(f"a binding names agent {b.agent!r}, a 'sub' agent (bind 'main' ones)")


def narrow_tools(a: list[str] | None, b: list[str] | None) -> list[str] | None:
    """Two allowed-tool lists combined (``None`` = no limit): only names both allow."""
    if a is None:
        return None if b is None else list(b)
    return list(a) if b is None else [t for t in a if t in b]


def as_agent(msg: InboundMessage, agent: AgentDefinition) -> InboundMessage:
    """``msg`` as ``agent`` runs it: the lower of the two trusts, and the agent's tool list
    within the message's own subset (a scheduled job's). Never wider than ``msg``."""
    trust = lower_trust(msg.trust, agent.trust)
    tools = narrow_tools(msg.allowed_tools, agent.allowed_tools)
    if trust == msg.trust and tools == msg.allowed_tools:
        return msg
    return msg.model_copy(update={"trust": trust, "allowed_tools": tools})
