"""The memory review, off the reply path and coalesced per conversation.

:class:`MemoryReviewer` reviews every pending turn of a conversation
(:mod:`fermix_shared.memory.reviews`) in ONE model call, so a busy chat pays one review per
burst, not per message; :meth:`MemoryReviewer.review_run` reviews one run at once, for callers
that want it now. A run is reviewed once either way (``memory_reviewed``).
:class:`QueueReview` is the post-turn listener that queues an operator's delivered turn.

Guests' turns are never reviewed (never queued; the reviewer refuses them). A failed review
logs and changes nothing; it never retries (memory is best-effort, and a second model call
could disagree with the first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import redis

from fermix_shared import audit
from fermix_shared.audit.model import Scalar
from fermix_shared.errors import ConfigError
from fermix_shared.memory import MemoryStore, reviews
from fermix_shared.messages import ChatMessage
from fermix_shared.models import RunStatus
from fermix_shared.settings import Settings
from fermix_shared.usage.scopes import Attribution, user_of
from fermix_worker.memory import review as review_mod
from fermix_worker.providers.routing import Router
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.listeners import TurnEnded
from fermix_worker.usage.metered import charged_to

log = logging.getLogger(__name__)

ReviewOutcome = Literal["refused", "duplicate", "gone", "misconfigured", "reviewed"]


class MemoryReviewer:
    """Reviews turns into long-term memory with the process's router."""

    def __init__(self, r: redis.Redis, router: Callable[[], Router]):
        self._r, self._router = r, router

    def review_conversation(self, conv: str) -> ReviewOutcome:
        """Review every pending turn of ``conv`` in one model call."""
        if not reviews.lock(self._r, conv):
            return "duplicate"  # another review of it runs: it is due again shortly
        try:
            pending = reviews.pending(self._r, conv)
            outcome = self._review_pending(conv, pending)
            reviews.reviewed(self._r, conv, len(pending))
            return outcome
        finally:
            reviews.unlock(self._r, conv)

    def review_run(self, run_id: str, conv: str, trust: str, agent: str = "default",
                   user: str = "") -> ReviewOutcome:
        """Review one turn's messages (from its checkpoint) into long-term memory."""
        if trust != "operator":
            log.warning("memory review of %s refused: %s turns are never reviewed", run_id,
                        trust)
            return "refused"
        if not reviews.first_review(self._r, run_id):  # the broker redelivered the task
            return "duplicate"
        state = Checkpoints(self._r).load(run_id)
        if state is None:
            log.warning("memory review of %s: its checkpoint is gone", run_id)
            return "gone"
        charged = Attribution(agent=agent, conversation=conv, user=user, run_id=run_id,
                              kind="memory_review")
        return self._review(conv, [run_id], state.model, state.turn_messages(), charged)

    def _review_pending(self, conv: str, pending: list[dict[str, str]]) -> ReviewOutcome:
        """One review over the turns of ``pending`` not reviewed yet, in order."""
        checkpoints = Checkpoints(self._r)
        messages: list[ChatMessage] = []
        runs: list[str] = []
        model = ""
        for entry in pending:
            run_id = entry["run_id"]
            if not reviews.first_review(self._r, run_id):
                continue  # reviewed on its own already
            state = checkpoints.load(run_id)
            if state is None:
                log.warning("memory review of %s: its checkpoint is gone", run_id)
                continue
            messages.extend(state.turn_messages())
            runs.append(run_id)
            model = state.model
        if not runs:
            return "duplicate"
        last = pending[-1]
        charged = Attribution(agent=last["agent"] or "default", conversation=conv,
                              user=last["user"], run_id=runs[-1], kind="memory_review")
        return self._review(conv, runs, model, messages, charged, batch=True)

    def _review(self, conv: str, runs: list[str], model: str, messages: list[ChatMessage],
                charged: Attribution, *, batch: bool = False) -> ReviewOutcome:
        """One model call over ``messages``, its changes applied and audited. ``batch``: the
        conversation's coalesced review (logged and audited with its turns)."""
        what = conv if batch else runs[0]
        try:
            provider = charged_to(self._router(), charged).for_turn()
        except ConfigError as e:
            log.warning("memory review of %s skipped: %s", what, e)
            return "misconfigured"
        result = review_mod.review_turn(MemoryStore(self._r), provider, model, messages, conv)
        changed = [f.id for f in (*result.added, *result.replaced, *result.archived)]
        turns: dict[str, Scalar] = (
            {"turns": len(runs), "runs": ",".join(runs)[:200]} if batch else {})
        audit.record(self._r, "memory", "review", "error" if result.error else "ok",
                     actor="worker", run_id=runs[-1], conv=conv, agent=charged.agent,
                     **turns, added=len(result.added), replaced=len(result.replaced),
                     archived=len(result.archived), ids=",".join(changed)[:200] or None)
        log.info("memory review of %s%s: %d added, %d replaced, %d archived%s", what,
                 f" ({len(runs)} turns)" if batch else "", len(result.added),
                 len(result.replaced), len(result.archived),
                 f" ({result.error})" if result.error else "")
        return "reviewed"


class QueueReview:
    """Post-turn listener: queue an operator's delivered interactive turn for its
    conversation's coalesced review. Not a scheduled run, a silent answer, nor a turn that
    merged other messages (a guest's words may be in it). Never raises (memory is
    best-effort; the reply is already delivered)."""

    def __init__(self, r: redis.Redis, settings: Settings):
        self._r = r
        self._quiet_s = settings.memory_review_quiet_seconds
        self._batch = settings.memory_review_batch_turns

    def __call__(self, ended: TurnEnded) -> None:
        msg, record = ended.msg, ended.record
        if not (record.status is RunStatus.ok and ended.committed and not ended.merged
                and not ended.silent and msg.trust == "operator"
                and msg.context == "interactive"):
            return
        try:
            reviews.queue_review(self._r, msg.run_id, msg.key.as_str(), msg.agent, user_of(msg),
                                 self._quiet_s, self._batch)
        except Exception as e:
            log.warning("memory review of %s not queued: %s", msg.run_id, e)
