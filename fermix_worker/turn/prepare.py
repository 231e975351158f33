"""Prepare: a claimed turn's inputs become the loop's first :class:`LoopState`. Pure.

The runner gathers the inputs (history from Redis, the prompt base, remembered facts, the
clock, what the ``before_model_resolve`` and ``before_prompt_build`` hooks said) and hands them
here; everything this module decides is unit-tested without Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fermix_shared.agents.definitions import DEFAULT_AGENT, AgentDefinition
from fermix_shared.messages import ChatMessage
from fermix_shared.models import InboundMessage
from fermix_worker.loop_state import LoopState
from fermix_worker.subagents.prompts import ULTRA_ADDENDUM


@dataclass(frozen=True)
class PromptOverride:
    """What a ``before_prompt_build`` hook returned: a whole new system prompt, and/or context
    to put before the user's text."""

    system: str | None = None
    prepend: str | None = None


@dataclass(frozen=True)
class TurnInputs:
    """Everything a new turn is built from.

    ``messages``: the claimed message first, then any merged into it (collect mode);
    ``facts``: the remembered-facts section ("" for guests, who never see the operator's
    memory); ``skills``: the available-skills section (only what the caller's trust may see);
    ``route_override``: ``provider/model`` when the agent or a hook moved the turn off the
    primary; ``agent``: the answering agent (its temperature and iteration bound).
    """

    messages: list[InboundMessage]
    history: list[ChatMessage]
    prompt_base: str
    facts: str
    now: datetime
    model: str
    route_override: str | None = None
    prompt: PromptOverride = PromptOverride()
    skills: str = ""
    agent: AgentDefinition = AgentDefinition(name=DEFAULT_AGENT)


def prompt_base(system_prompt: str, memory_files: str) -> str:
    """The prompt's base: the agent's system prompt, then the memory files' section."""
    return "\n\n".join(p for p in (system_prompt, memory_files) if p)


def merge_texts(messages: list[InboundMessage]) -> str:
    """Collect mode: pending messages become one turn, in arrival order."""
    if len(messages) == 1:
        return messages[0].text
    return "\n\n".join(m.text for m in messages)


def system_prompt(inputs: TurnInputs) -> str:
    """The stable part: prompt base (+ memory files) and available skills; /ultra adds its
    addendum. A hook's system prompt replaces it (and the turn's note)."""
    if inputs.prompt.system is not None:
        return inputs.prompt.system
    system = "\n\n".join(p for p in (inputs.prompt_base, inputs.skills) if p)
    if inputs.messages[0].profile == "ultra":  # same loop, wider subagent caps, this addendum
        system = f"{system}\n\n{ULTRA_ADDENDUM}"
    return system


def turn_note(inputs: TurnInputs) -> ChatMessage | None:
    """The per-turn values, as a system note after the history: the remembered facts
    (recalled for this message) and a fresh date (the seed's: not part of the cached prompt,
    so it never goes stale). Placed after the history, not in the system prompt, so the
    prompt's prefix (tools, system prompt, history) is the same byte for byte from turn to
    turn and the provider's prompt cache can serve it. Not committed to history. None when a
    hook replaced the system prompt."""
    if inputs.prompt.system is not None:
        return None
    today = inputs.now.strftime("%A %Y-%m-%d %H:%M UTC")
    text = "\n\n".join(p for p in (inputs.facts, f"Current date: {today}.") if p)
    return ChatMessage(role="system", content=text)


def prepare(inputs: TurnInputs) -> LoopState:
    """The turn's first state: history, the turn's note, then the user's message (merged
    texts, after any context a hook prepended), under the composed system prompt. The note
    sits before ``turn_start``: the turn's own messages (committed, reviewed) start with the
    user's."""
    head, note = inputs.messages[0], turn_note(inputs)
    text = merge_texts(inputs.messages)
    if inputs.prompt.prepend:
        text = f"{inputs.prompt.prepend}\n\n{text}"
    state = LoopState.start(
        run_id=head.run_id, model=inputs.model, system=system_prompt(inputs),
        history=[*inputs.history, note] if note else inputs.history,
        user=ChatMessage(role="user", content=text), context=head.context,
    )
    state.merged_runs = [m.run_id for m in inputs.messages[1:]]
    state.route_override = inputs.route_override
    state.agent, state.temperature = inputs.agent.name, inputs.agent.temperature
    if inputs.agent.max_iterations is not None:  # within the context's cap, never above it
        state.max_iterations = min(state.max_iterations, inputs.agent.max_iterations)
    return state
