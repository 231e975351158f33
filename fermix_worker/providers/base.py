"""The provider adapter contract: one provider-neutral request in, one model turn out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fermix_shared.messages import ChatMessage, ToolCall


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description, JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    model: str
    system: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    # "minimal" | "low" | "medium" | "high": how much the model thinks first (per-call
    # subagent routing). OpenAI: reasoning_effort; Anthropic: an extended-thinking budget.
    reasoning_effort: str | None = None
    # Sampling temperature (an agent's ``temperature``); None leaves the provider's default.
    # OpenAI-compatible routes only: Anthropic's Messages API takes none.
    temperature: float | None = None


@dataclass(frozen=True)
class ModelTurn:
    """What one model call produced."""

    content: str
    tool_calls: list[ToolCall]
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    # Name of the provider route that answered and its configured model (set by
    # RoutedProvider; "" from a bare adapter).
    route: str = ""
    route_model: str = ""
    # The model's reasoning text, when it showed any (a `thinking` run event), and the
    # provider blocks to replay with this turn's assistant message (ChatMessage.reasoning).
    thinking: str = ""
    reasoning: list[dict[str, Any]] = field(default_factory=list)


OnDelta = Callable[[str], None]


class Provider(Protocol):
    """An adapter over one provider's official SDK.

    ``complete`` streams: each text fragment goes to ``on_delta`` as it arrives. SDK errors are
    translated to :class:`fermix_shared.errors.ProviderError` subclasses.
    """

    name: str

    def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn: ...
