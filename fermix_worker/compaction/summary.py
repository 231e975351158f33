"""Compaction: older messages summarized by a model call into a checkpoint that replaces them.

Pure planning (``plan``) is separate from the model call (``Compactor.summarize``). A cut is
only ever made just before a user message, so a tool call is never separated from its result,
and the recent ``keep_turns`` user turns stay verbatim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fermix_shared.messages import ChatMessage
from fermix_worker.loop import CompletingProvider
from fermix_worker.providers.base import ModelRequest

CHECKPOINT_PREFIX = "[Summary of the earlier conversation, which was compacted]\n"
PREFLIGHT_NOTICE = "Trimmed older conversation history to stay within the context window."
POST_TURN_NOTICE = (
    "🗜️ Trimmed older conversation history to stay within the context window — long-term "
    "memory is kept."
)
# OpenFang's notice while a turn that overflowed the context window is shrunk and retried.
OVERFLOW_RECOVERING = "[context overflow, recovering...]"
OVERFLOW_MESSAGE = (
    "This conversation no longer fits in the model's context window. Send /compact to "
    "summarize it, or /new to start a fresh conversation (long-term memory is kept)."
)
SUMMARY_INSTRUCTION = (
    "Summarize the conversation above for your own future reference: the user's goals, "
    "decisions made, facts and numbers established, open questions and anything you promised. "
    "Be concise and complete; write it as notes, not as a reply to the user."
)
SUMMARY_SYSTEM = "You compact conversation history into faithful, compact notes."


@dataclass(frozen=True)
class Plan:
    """``head`` is summarized; ``tail`` is kept verbatim."""

    head: list[ChatMessage]
    tail: list[ChatMessage]


def plan(history: list[ChatMessage], keep_turns: int) -> Plan | None:
    """Where to cut, or None when there is nothing worth compacting."""
    user_at = [i for i, m in enumerate(history) if m.role == "user"]
    if len(user_at) <= keep_turns:
        return None
    cut = user_at[-keep_turns]
    head = history[:cut]
    if len(head) < 2 and not (head and head[0].content.startswith(CHECKPOINT_PREFIX)):
        return None
    return Plan(head, history[cut:])


def estimate_tokens(messages: list[ChatMessage]) -> int:
    """A rough size (chars / 4) for reports only; triggers use provider-reported counts."""
    return sum(len(m.content) + len(json.dumps([c.arguments for c in m.tool_calls])) for m in messages) // 4


def _transcript(messages: list[ChatMessage]) -> str:
    lines = []
    for m in messages:
        if m.role == "tool":
            lines.append(f"[tool {m.tool_name} result] {m.content[:2000]}")
        elif m.tool_calls:
            calls = ", ".join(f"{c.name}({json.dumps(c.arguments)[:300]})" for c in m.tool_calls)
            lines.append(f"assistant: {m.content}\n[called {calls}]".strip())
        else:
            lines.append(f"{m.role}: {m.content}")
    return "\n\n".join(lines)


class Compactor:
    def __init__(self, provider: CompletingProvider, model: str, max_tokens: int = 2048):
        self._provider = provider
        self._model = model
        self._max_tokens = max_tokens

    def summarize(self, head: list[ChatMessage]) -> tuple[ChatMessage, int]:
        """The checkpoint message for ``head`` and the provider-reported size of the input.

        Raises ProviderError when the summary call fails (history is then left intact)."""
        request = ModelRequest(
            model=self._model,
            system=SUMMARY_SYSTEM,
            messages=[ChatMessage(role="user",
                                  content=f"{_transcript(head)}\n\n---\n{SUMMARY_INSTRUCTION}")],
            max_tokens=self._max_tokens,
        )
        turn = self._provider.chat(request, lambda _: None)
        summary = turn.content.strip()
        if not summary:
            raise ValueError("the summary call returned nothing")
        return ChatMessage(role="user", content=CHECKPOINT_PREFIX + summary), turn.input_tokens
