"""Dispatcher: claim a conversation, run (or close) its head turn, hand on to the next.

``kick(conv)`` enqueues another dispatch for the conversation; the Celery task supplies it.
A dispatch carries only the conversation key, so a redelivered or duplicate dispatch is
harmless: it finds the conversation busy, or takes the next message. One whose next message is
for a paused agent takes nothing (``paused``); resuming the agent dispatches it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from fermix_shared import metrics, tracing
from fermix_shared.channels.modes import queue_mode_for
from fermix_shared.logs import log_context
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from fermix_shared.stores import queue
from fermix_shared.stores.lease import TurnLease
from fermix_worker.turn.outcome import waiting
from fermix_worker.turn.runner import TurnRunner

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        r: redis.Redis,
        settings: Settings,
        runner: TurnRunner,
        worker: str,
        kick: Callable[[str], None],
    ):
        self._r = r
        self._settings = settings
        self._runner = runner
        self._worker = worker
        self._kick = kick

    def dispatch(self, conv: str) -> str:
        """Take the conversation if it is free; returns what happened (for logs and tests).
        With tracing on, the claim is a span of the claimed turn's trace (``fermix.claim``,
        from the task's start)."""
        started_ns = time.time_ns() if tracing.enabled() else 0
        # The channel's mode; the claim reads the conversation's own (/queue MODE) itself.
        mode = queue_mode_for(self._settings, ConversationKey.parse(conv).channel)
        claim, lease = queue.claim(
            self._r, conv, self._worker, self._settings.lease_seconds, collect=mode == "collect"
        )
        if not claim.messages or lease is None:
            # busy, empty, or paused: nothing to run now. A held conversation is dispatched
            # again when its agent resumes.
            if claim.kind == "paused":
                log.debug("conversation %s waits for paused agent %s", conv, claim.agent)
            return claim.kind
        if started_ns:
            tracing.past_span(claim.messages[0].trace, "fermix.claim", started_ns, attributes={
                "fermix.run_id": claim.messages[0].run_id, "fermix.claim.kind": claim.kind,
                "fermix.worker": self._worker})
        with log_context(run_id=claim.messages[0].run_id, conversation=conv,
                         agent=claim.messages[0].agent, worker=self._worker):
            return self._run(conv, claim, lease)

    def _run(self, conv: str, claim: queue.Claim, lease: TurnLease) -> str:
        if claim.kind == "orphan":
            log.warning("conversation %s: turn %s lost its worker (attempt %d)",
                        conv, lease.turn_id, claim.attempt)
            if claim.cancelled or claim.attempt > self._settings.turn_max_attempts:
                # Cancelled turns close as stopped; past the bound, the generic error.
                metrics.count_reaper_recovery("orphan_closed")
                outcome = self._runner.close_orphan(claim.messages[0], lease, claim.cancelled)
            else:
                metrics.count_reaper_recovery("resumed")
                outcome = self._runner.resume(claim.messages[0], lease, claim.attempt)
        elif claim.messages[0].kind == "compact":
            outcome = self._runner.compact_turn(claim.messages[0], lease)
        else:
            outcome = self._runner.run(claim.messages, lease)
        if waiting(outcome) > 0:
            self._kick(conv)
        return claim.kind
