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
from fermix_shared.memory.prompt_files import compress_memory
from fermix_shared.models import InboundMessage
from fermix_shared.run_events import (
    CompactionEnded,
    CompactionErrored,
    CompactionStarted,
    Diagnostic,
)
from fermix_shared.settings import Settings
from fermix_shared.stores import history
from fermix_shared.stores.events import RunEvents
from fermix_shared.usage.scopes import attribution_for
from fermix_worker.compaction.conversation import Compacted, CompactionFailed, ConversationCompactor
from fermix_worker.compaction.summary import OVERFLOW_RECOVERING
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

    def needed_by(self, measured: tuple[int, str] | None, backing_off: bool) -> bool:
        """:meth:`needed` over what the caller read (``ConversationCompactor.needed_by``)."""
        return self._compactor.needed_by(measured, backing_off)

    def compact(
        self, msg: InboundMessage, notice: str | None, *, reason: str
    ) -> Compacted | CompactionFailed | None:
        """Compact the conversation now; send ``notice`` into the chat when it compacted.
        Returns the failure instead of raising it (history is then unchanged); None when
        there was nothing to compact."""
        # A post-turn job is the turn's: its events and hooks name the turn it follows.
        run_id = msg.follows_run or msg.run_id
        events = RunEvents(self._r, run_id)
        events.emit(CompactionStarted(reason=reason))
        hook_payload = {"run_id": run_id, "conversation": msg.key.as_str(), "reason": reason}
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

    def recovering(self, msg: InboundMessage) -> None:
        """Say the turn overflowed and is being shrunk (OpenFang: "users see a brief
        ``[context overflow, recovering...]`` notice"): into the chat once per turn, and on
        the run's events (an HTTP run's only notice)."""
        RunEvents(self._r, msg.run_id).emit(
            Diagnostic(kind="context_overflow", values={"message": OVERFLOW_RECOVERING}))
        self._notify(msg, OVERFLOW_RECOVERING, f"{msg.run_id}:overflow")

    def shrink(self, msg: InboundMessage, state: LoopState) -> bool:
        """After a context overflow, OpenFang's recovery: trim the oldest messages (compact
        the stored history and rebuild the prompt on it; when nothing compacts, drop the older
        half of the history from this prompt), cut long tool results of this turn, compress
        the remembered facts. False when nothing could shrink."""
        changed = isinstance(self.compact(msg, None, reason="overflow"), Compacted)
        if changed:
            past = history.load(self._r, msg.key.as_str(), self._settings.history_limit)
            turn, kept = state.turn_messages(), [n for n in [state.turn_note()] if n]
            # Stored history ends with this turn's user message; the turn's note goes before it.
            state.messages = [*past[:-1], *kept, *turn]
            state.turn_start = len(past) - 1 + len(kept)
        else:
            changed = _drop_oldest(state)
        for i, m in enumerate(state.messages):
            if m.role == "tool" and len(m.content) > TRIMMED_TOOL_RESULT:
                cut = m.content[:TRIMMED_TOOL_RESULT] + "\n[cut to fit the context window]"
                state.messages[i] = m.model_copy(update={"content": cut})
                changed = True
        compressed = compress_memory(state.system)
        if compressed != state.system:
            state.system, changed = compressed, True
        if (note := state.turn_note()) is not None and (
                small := compress_memory(note.content)) != note.content:  # the facts are here
            state.messages[state.turn_start - 1] = note.model_copy(update={"content": small})
            changed = True
        if changed:  # the provider's transcript is of the old prompt: the retry re-sends
            state.provider_state = None
        return changed


def _drop_oldest(state: LoopState) -> bool:
    """Drop the older half of the history before this turn from its prompt, cut at a user
    message (a tool result never loses its call). False when there is nothing to drop."""
    past = state.messages[: state.turn_start - (state.turn_note() is not None)]  # not the note
    starts = [i for i, m in enumerate(past) if m.role == "user" and i >= len(past) // 2]
    keep_from = starts[0] if starts else len(past)
    if keep_from == 0:
        return False
    state.messages = state.messages[keep_from:]
    state.turn_start -= keep_from
    return True
