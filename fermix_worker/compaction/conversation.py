"""ConversationCompactor: when a conversation must be compacted, and doing it.

The trigger is always the provider-reported prompt size of the conversation's last turn
(saved by the turn), never a local estimate: at ``threshold`` x the model's context window.
A failed compaction leaves history intact and backs off (60 s by default) for that
conversation. Runs only while its caller holds the conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis

from fermix_shared import keys
from fermix_shared.errors import FermixError
from fermix_shared.provider_routes import resolved_model
from fermix_shared.settings import Settings
from fermix_shared.stores import history
from fermix_shared.usage.scopes import Attribution
from fermix_worker.compaction.summary import Compactor, estimate_tokens, plan
from fermix_worker.providers import Router
from fermix_worker.providers.context_windows import context_window
from fermix_worker.usage.metered import charged_to

log = logging.getLogger(__name__)


class CompactionFailed(FermixError):
    """The summary call failed; the conversation is unchanged and backs off."""


@dataclass(frozen=True)
class Compacted:
    """A compaction's sizes: ``before_tokens`` is the provider-reported prompt size of the
    last turn, or a local estimate when none was measured (``before_estimated``); the size
    after is always an estimate (no model call has seen the compacted history yet)."""

    before_tokens: int
    after_tokens: int
    before_estimated: bool = False


class ConversationCompactor:
    def __init__(self, r: redis.Redis, settings: Settings, router: Callable[[], Router]):
        self._r = r
        self._settings = settings
        self._router = router

    def needed(self, conv: str) -> bool:
        """The last measurement crossed the threshold (and no failure is backing off)."""
        measured = history.measurement(self._r, conv)
        return measured is not None and self.needed_by(
            measured, bool(self._r.exists(keys.compact_backoff(conv))))

    def needed_by(self, measured: tuple[int, str] | None, backing_off: bool) -> bool:
        """:meth:`needed` over what the caller read: the conversation's measurement
        (``history.measurement_from``) and whether its backoff key exists."""
        return not backing_off and self.crosses(measured)

    def crosses(self, measured: tuple[int, str] | None) -> bool:
        """Compaction is on and ``measured`` (prompt tokens, model) crossed its threshold."""
        cfg = self._settings.compaction
        if not cfg.enabled or measured is None:
            return False
        tokens, model = measured
        return tokens >= cfg.threshold * context_window(model, self._settings)

    def compact(self, conv: str, charged: Attribution) -> Compacted | None:
        """Summarize the older part of the conversation into a checkpoint (its summary call
        charged to ``charged``); None when there is nothing to compact. Raises
        CompactionFailed (history untouched, backoff set)."""
        raw, messages = history.load_all(self._r, conv)
        cut = plan(messages, self._settings.compaction.keep_turns)
        if cut is None:
            return None
        measured = history.measurement(self._r, conv)
        model = measured[1] if measured else resolved_model(self._settings)
        try:
            provider = charged_to(self._router(), charged).for_turn()
            checkpoint, _ = Compactor(provider, model).summarize(cut.head)
        except Exception as e:
            self._r.set(keys.compact_backoff(conv), "1",
                        ex=max(1, int(self._settings.compaction.backoff_seconds)))
            log.warning("compaction of %s failed (%s: %s); backing off", conv, type(e).__name__, e)
            raise CompactionFailed(str(e)) from e
        if not history.replace_prefix(self._r, conv, raw[: len(cut.head)], checkpoint):
            return None
        before = measured[0] if measured else estimate_tokens(messages)
        history.clear_measurement(self._r, conv)
        return Compacted(before, estimate_tokens([checkpoint, *cut.tail]),
                         before_estimated=measured is None)
