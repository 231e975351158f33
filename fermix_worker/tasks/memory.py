# mypy: disallow-untyped-decorators=False
"""The memory review's Celery tasks: thin shells over :class:`MemoryReviewer`.

``fermix.memory.review_conversation`` reviews a conversation's pending turns in one model call
(the sweeper sends it when the review is due); ``fermix.memory.review`` reviews one run at once.
"""

from __future__ import annotations

import logging

from fermix_shared.celery_app import app
from fermix_shared.task_names import REVIEW_CONVERSATION_TASK, REVIEW_TASK
from fermix_worker.memory.reviewer import ReviewOutcome
from fermix_worker.runtime import Runtime

log = logging.getLogger(__name__)


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


@app.task(name=REVIEW_CONVERSATION_TASK, acks_late=True, ignore_result=True)
def review_conversation(conv: str) -> ReviewOutcome:
    """Review every pending turn of ``conv`` in one model call."""
    return Runtime.current().memory_reviewer.review_conversation(conv)


@app.task(name=REVIEW_TASK, acks_late=True, ignore_result=True)
def review(run_id: str, conv: str, trust: str, agent: str = "default",
           user: str = "") -> ReviewOutcome:
    """Review the turn's messages (from its checkpoint) into long-term memory."""
    return Runtime.current().memory_reviewer.review_run(run_id, conv, trust, agent, user)
