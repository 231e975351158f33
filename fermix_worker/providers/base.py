"""The provider adapter contract (the seed's): ``chat`` and ``continue_``.

``chat(request, on_delta)`` is a turn's first call: the provider-neutral transcript in, one
model turn out. ``continue_(provider_state, tool_results, opts, on_delta)`` is every call after
it: the ``provider_state`` the previous call returned, the neutral messages added since (tool
results, and any notice or steered message), and the call's options. ``provider_state`` is the
adapter's own transcript (its wire format, Anthropic's thinking blocks with their signatures
included), JSON, opaque to the loop, which checkpoints it and hands it back, on any worker.
An adapter given a state that is not its own (another provider answered it, or none: an older
checkpoint, a prompt rebuilt after an overflow) answers from ``opts.messages`` as ``chat``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fermix_shared.messages import ChatMessage, ToolCall

# A provider's own transcript, opaque to the loop (JSON: it is checkpointed).
ProviderState = dict[str, Any]


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
    """What one model call produced.

    Usage, as the provider reported it, in one meaning for every adapter: ``input_tokens`` is
    every input token of the prompt as sent, the cached ones included (OpenAI's
    ``prompt_tokens``; Anthropic's ``input_tokens + cache_read_input_tokens +
    cache_creation_input_tokens``), so it measures the prompt's size whatever was cached;
    ``cache_read_tokens`` and ``cache_write_tokens`` are the part of it read from and written
    to the provider's prompt cache (billed at their own rates), the rest
    (:attr:`uncached_input_tokens`) at the input rate. ``output_tokens`` includes
    ``reasoning_tokens``, the part spent thinking (both providers bill them as output).
    """

    content: str
    tool_calls: list[ToolCall]
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    # Name of the provider route that answered and its configured model (set by
    # RoutedProvider; "" from a bare adapter).
    route: str = ""
    route_model: str = ""
    # The model's reasoning text, when it showed any (a `thinking` run event).
    thinking: str = ""
    # The adapter's transcript after this call, to continue from (None: the adapter keeps
    # none, and the next call re-sends the neutral messages).
    provider_state: ProviderState | None = None
    # Parts of input_tokens (cache reads, cache writes) and of output_tokens (reasoning).
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    # Why the model stopped, as its API said (OpenAI ``finish_reason``, Anthropic
    # ``stop_reason``; "" when it said nothing), and the provider of the route that answered
    # (set by RoutedProvider): what a model call's span reports.
    finish_reason: str = ""
    provider: str = ""

    @property
    def uncached_input_tokens(self) -> int:
        """The input tokens billed at the full input rate."""
        return max(0, self.input_tokens - self.cache_read_tokens - self.cache_write_tokens)


OnDelta = Callable[[str], None]


class Provider(Protocol):
    """An adapter over one provider's official SDK.

    Both calls stream: each text fragment goes to ``on_delta`` as it arrives. SDK errors are
    translated to :class:`fermix_shared.errors.ProviderError` subclasses.
    """

    name: str

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn: ...

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn: ...


def own_state(provider_state: ProviderState | None, provider: str) -> list[dict[str, Any]] | None:
    """The wire messages of ``provider_state`` if ``provider`` wrote it, else None."""
    if not provider_state or provider_state.get("provider") != provider:
        return None
    messages = provider_state.get("messages")
    return messages if isinstance(messages, list) else None


def unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """``calls`` with every id present and unique (``call_<i>`` where not), so the provider's
    transcript and the loop's tool results name the same calls."""
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        call_id = call.id if call.id and call.id not in seen else f"call_{i}"
        seen.add(call_id)
        out.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return out


class Resending:
    """A provider (or router) with no transcript of its own, built on one ``complete``: each
    call re-sends the neutral messages (``initial``: the turn's first call)."""

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool) -> ModelTurn:
        raise NotImplementedError

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self.complete(request, on_delta, initial=True)

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self.complete(opts, on_delta, initial=False)
