"""Compaction inside a conversation's order: the turn's preflight pass, its overflow recovery,
the post-turn job (scheduled by :class:`~fermix_worker.compaction.listener.ScheduleCompaction`), and ``/compact``.

Each runs while its caller holds the conversation; each announces itself on the run's events
(``compaction`` start/end/error) and through the before/after compaction hooks, and a pass
that compacted sends the seed's notice into the chat when asked to.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from fermix_shared.hooks import HookRegistry
from fermix_shared.models import InboundMessage
from fermix_shared.run_events import CompactionEnded, CompactionErrored, CompactionStarted
from fermix_shared.settings import Settings
from fermix_shared.stores import history
from fermix_shared.stores.events import RunEvents
from fermix_shared.usage.scopes import attribution_for
from fermix_worker.compaction.conversation import Compacted, CompactionFailed, ConversationCompactor
from fermix_worker.loop_state import LoopState

# Tool results longer than this are cut when a turn overflows the context window.
TRIMMED_TOOL_RESULT = 4_000

Notify = Callable[[InboundMessage, str, str], None]


class CompactionStep:
    """Compacts a held conversation; ``notify(msg, text, delivery_id)`` sends a notice."""

    def __init__(self, r: redis.Redis, settings: Settings, compactor: ConversationCompactor,
                 hooks: HookRegistry, notify: Notify):
        self._r = r
        self._settings = settings
        self._compactor = compactor
        self._hooks = hooks
        self._notify = notify

    def needed(self, conv: str) -> bool:
        return self._compactor.needed(conv)

    def compact(
        self, msg: InboundMessage, notice: str | None, *, reason: str
    ) -> Compacted | CompactionFailed | None:
        """Compact the conversation now; send ``notice`` into the chat when it compacted.
        Returns the failure instead of raising it (history is then unchanged); None when
        there was nothing to compact."""
        events = RunEvents(self._r, msg.run_id)
        events.emit(CompactionStarted(reason=reason))
        hook_payload = {"run_id": msg.run_id, "conversation": msg.key.as_str(), "reason": reason}
        if self._hooks.has("before_compaction"):
            self._hooks.call("before_compaction", hook_payload)
        try:
            # The summary call is charged to the conversation's agent and user.
            done = self._compactor.compact(msg.key.as_str(), attribution_for(msg, "compaction"))
        except CompactionFailed as e:
            events.emit(CompactionErrored(reason=reason, error=str(e)))
            return e
        sizes = {"beforeTokens": done.before_tokens, "afterTokens": done.after_tokens} if done else {}
        events.emit(CompactionEnded(reason=reason, compacted=done is not None,
                                    before_tokens=done.before_tokens if done else None,
                                    after_tokens=done.after_tokens if done else None))
        if self._hooks.has("after_compaction"):
            self._hooks.call("after_compaction", {**hook_payload, "compacted": done is not None, **sizes})
        if done and notice:
            self._notify(msg, notice, f"{msg.run_id}:compaction")
        return done

    def shrink(self, msg: InboundMessage, state: LoopState) -> bool:
        """After a context overflow: compact the stored history and rebuild the turn's prompt
        on it, and cut long tool results of this turn. False when nothing could shrink."""
        changed = isinstance(self.compact(msg, None, reason="overflow"), Compacted)
        if changed:
            past = history.load(self._r, msg.key.as_str(), self._settings.history_limit)
            turn = state.turn_messages()
            state.messages = [*past[:-1], *turn]  # stored history ends with this turn's user message
            state.turn_start = len(past) - 1
        for i, m in enumerate(state.messages):
            if m.role == "tool" and len(m.content) > TRIMMED_TOOL_RESULT:
                cut = m.content[:TRIMMED_TOOL_RESULT] + "\n[cut to fit the context window]"
                state.messages[i] = m.model_copy(update={"content": cut})
                changed = True
        return changed
