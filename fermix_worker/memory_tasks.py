"""The memory review task: a thin shell that loads a delivered turn and reviews it.

Enqueued by :func:`dispatch_review` after an operator's turn was delivered, so the review is
off the reply path. Guests' turns are never reviewed: ``dispatch_review`` does not enqueue
them and the task refuses them. A failed review logs and changes nothing; it never retries
(memory is best-effort, and a second model call could disagree with the first).
"""

from __future__ import annotations

import logging
from typing import Literal

from fermix_shared import audit, keys
from fermix_shared.celery_app import app
from fermix_shared.errors import ConfigError
from fermix_shared.memory import MemoryStore
from fermix_shared.models import RunStatus
from fermix_shared.redis_client import get_redis
from fermix_shared.settings import get_settings
from fermix_shared.usage.scopes import Attribution, attributed, user_of
from fermix_worker.memory_review import review_turn
from fermix_worker.providers import get_router
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.listeners import TurnEnded

log = logging.getLogger(__name__)

REVIEW_TASK = "fermix.memory.review"

ReviewOutcome = Literal["refused", "duplicate", "gone", "misconfigured", "reviewed"]


def dispatch_review(run_id: str, conv: str, trust: str, agent: str = "default",
                    user: str = "") -> None:
    """Enqueue the memory review of the delivered turn ``run_id`` in ``conv``; does nothing
    unless ``trust`` is ``"operator"`` (guests are never reviewed into memory). Never raises:
    it runs after delivery, and a review that could not be enqueued is only logged. The
    review's model call is charged to the turn's ``agent``, conversation and ``user``."""
    if trust != "operator":
        return
    try:
        review.apply_async(args=[run_id, conv, trust], kwargs={"agent": agent, "user": user})
    except Exception as e:  # the broker is unreachable: memory is best-effort
        log.warning("memory review of %s not enqueued: %s", run_id, e)


def review_ended_turn(ended: TurnEnded) -> None:
    """Post-turn listener: review an operator's delivered interactive turn, off the reply
    path. Not a scheduled run, a silent answer, nor a turn that merged other messages (a
    guest's words may be in it)."""
    msg, record = ended.msg, ended.record
    if (record.status is RunStatus.ok and ended.committed and not ended.merged
            and not ended.silent and msg.trust == "operator" and msg.context == "interactive"):
        dispatch_review(msg.run_id, msg.key.as_str(), msg.trust, msg.agent, user_of(msg))


@app.task(name=REVIEW_TASK, acks_late=True, ignore_result=True)
def review(run_id: str, conv: str, trust: str, agent: str = "default",
           user: str = "") -> ReviewOutcome:
    """Review the turn's messages (from its checkpoint) into long-term memory."""
    if trust != "operator":
        log.warning("memory review of %s refused: %s turns are never reviewed", run_id, trust)
        return "refused"
    r = get_redis()
    # Once per run, even if the broker redelivers the task.
    if not r.set(keys.memory_reviewed(run_id), "1", nx=True,
                 ex=keys.MEMORY_REVIEWED_TTL_SECONDS):
        return "duplicate"
    state = Checkpoints(r).load(run_id)
    if state is None:
        log.warning("memory review of %s: its checkpoint is gone", run_id)
        return "gone"
    try:
        provider = get_router(get_settings()).for_turn()
    except ConfigError as e:
        log.warning("memory review of %s skipped: %s", run_id, e)
        return "misconfigured"
    charged = Attribution(agent=agent, conversation=conv, user=user, run_id=run_id,
                          kind="memory_review")
    with attributed(charged):
        result = review_turn(MemoryStore(r), provider, state.model, state.turn_messages(), conv)
    changed = [f.id for f in (*result.added, *result.replaced, *result.archived)]
    audit.record(r, "memory", "review", "error" if result.error else "ok", actor="worker",
                 run_id=run_id, conv=conv, agent=agent, added=len(result.added),
                 replaced=len(result.replaced), archived=len(result.archived),
                 ids=",".join(changed)[:200] or None)
    log.info("memory review of %s: %d added, %d replaced, %d archived%s", run_id,
             len(result.added), len(result.replaced), len(result.archived),
             f" ({result.error})" if result.error else "")
    return "reviewed"
