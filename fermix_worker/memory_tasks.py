"""The memory review, off the reply path and coalesced per conversation.

After an operator's delivered interactive turn, :func:`review_ended_turn` only records it as
pending for its conversation (:func:`queue_review`: one list push and one sorted-set update)
and makes the conversation's review due once it has been quiet for
``memory_review_quiet_seconds`` (each new turn pushes that back), or at once when
``memory_review_batch_turns`` turns wait. The reaper starts due reviews
(:func:`start_due_reviews`, the ZREM decides who); ``fermix.memory.review_conversation``
then reviews every pending turn of the conversation in ONE model call, so a busy chat pays one
review per burst, not per message. Nothing is missed: pending turns stay in Redis until a
review took them, through restarts.

Guests' turns are never reviewed (never queued; the tasks refuse them). A failed review logs
and changes nothing; it never retries (memory is best-effort, and a second model call could
disagree with the first). ``fermix.memory.review`` (one run, at once) remains for callers
that want a turn reviewed now; a run is reviewed once either way (``memory_reviewed``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

import redis

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
REVIEW_CONVERSATION_TASK = "fermix.memory.review_conversation"
# How long one conversation's review may run before another may start (its lock's TTL).
REVIEWING_TTL_S = 300
# Due reviews started per reaper scan.
DUE_LIMIT = 100

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


def queue_review(r: redis.Redis, run_id: str, conv: str, agent: str, user: str,
                 quiet_s: float, batch: int, now_ms: int | None = None) -> None:
    """Record ``run_id`` as waiting for its conversation's next review, and set when that is
    due: ``quiet_s`` from now (a later turn pushes it back), or now once ``batch`` wait."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    entry = json.dumps({"run_id": run_id, "agent": agent, "user": user})
    pipe = r.pipeline(transaction=True)
    pipe.rpush(keys.memory_pending(conv), entry)
    pipe.expire(keys.memory_pending(conv), keys.MEMORY_REVIEWED_TTL_SECONDS)
    waiting = pipe.execute()[0]
    due = now if int(waiting) >= batch else now + int(quiet_s * 1000)
    r.zadd(keys.memory_review_due(), {conv: due})


def review_ended_turn(ended: TurnEnded) -> None:
    """Post-turn listener: queue an operator's delivered interactive turn for its
    conversation's coalesced review. Not a scheduled run, a silent answer, nor a turn that
    merged other messages (a guest's words may be in it). Never raises (memory is
    best-effort; the reply is already delivered)."""
    msg, record = ended.msg, ended.record
    if not (record.status is RunStatus.ok and ended.committed and not ended.merged
            and not ended.silent and msg.trust == "operator" and msg.context == "interactive"):
        return
    settings = get_settings()
    try:
        queue_review(get_redis(), msg.run_id, msg.key.as_str(), msg.agent, user_of(msg),
                     settings.memory_review_quiet_seconds, settings.memory_review_batch_turns)
    except Exception as e:
        log.warning("memory review of %s not queued: %s", msg.run_id, e)


def start_due_reviews(r: redis.Redis, send: Callable[[str], None],
                      now_ms: int | None = None) -> list[str]:
    """The reaper's part: start the review of every conversation whose review is due (the
    ZREM that removes it decides which process sends it). Returns those conversations."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    due: Any = r.zrangebyscore(keys.memory_review_due(), "-inf", now, start=0, num=DUE_LIMIT)
    started = []
    for raw in due:
        conv = raw.decode() if isinstance(raw, bytes) else str(raw)
        if r.zrem(keys.memory_review_due(), conv):
            send(conv)
            started.append(conv)
    return started


def _take_pending(r: redis.Redis, conv: str) -> list[dict[str, str]]:
    """The conversation's pending turns, oldest first (left in place until reviewed)."""
    out = []
    for raw in r.lrange(keys.memory_pending(conv), 0, -1):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("run_id"), str):
            out.append({k: str(entry.get(k) or "") for k in ("run_id", "agent", "user")})
    return out


@app.task(name=REVIEW_CONVERSATION_TASK, acks_late=True, ignore_result=True)
def review_conversation(conv: str) -> ReviewOutcome:
    """Review every pending turn of ``conv`` in one model call."""
    r = get_redis()
    if not r.set(keys.memory_reviewing(conv), "1", nx=True, ex=REVIEWING_TTL_S):
        # Another review of this conversation runs: look again once it should be done.
        r.zadd(keys.memory_review_due(), {conv: int(time.time() * 1000) + 5_000})
        return "duplicate"
    try:
        pending = _take_pending(r, conv)
        outcome = _review_runs(r, conv, pending)
        if pending:  # what came in meanwhile stays for the next review
            r.ltrim(keys.memory_pending(conv), len(pending), -1)
        return outcome
    finally:
        r.delete(keys.memory_reviewing(conv))


def _review_runs(r: redis.Redis, conv: str, pending: list[dict[str, str]]) -> ReviewOutcome:
    """One review over the turns of ``pending`` not reviewed yet, in order."""
    checkpoints = Checkpoints(r)
    messages = []
    runs: list[str] = []
    model = ""
    for entry in pending:
        run_id = entry["run_id"]
        if not r.set(keys.memory_reviewed(run_id), "1", nx=True,
                     ex=keys.MEMORY_REVIEWED_TTL_SECONDS):
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
    try:
        provider = get_router(get_settings()).for_turn()
    except ConfigError as e:
        log.warning("memory review of %s skipped: %s", conv, e)
        return "misconfigured"
    charged = Attribution(agent=last["agent"] or "default", conversation=conv, user=last["user"],
                          run_id=runs[-1], kind="memory_review")
    with attributed(charged):
        result = review_turn(MemoryStore(r), provider, model, messages, conv)
    changed = [f.id for f in (*result.added, *result.replaced, *result.archived)]
    audit.record(r, "memory", "review", "error" if result.error else "ok", actor="worker",
                 run_id=runs[-1], conv=conv, agent=last["agent"] or "default",
                 turns=len(runs), runs=",".join(runs)[:200], added=len(result.added),
                 replaced=len(result.replaced), archived=len(result.archived),
                 ids=",".join(changed)[:200] or None)
    log.info("memory review of %s (%d turns): %d added, %d replaced, %d archived%s", conv,
             len(runs), len(result.added), len(result.replaced), len(result.archived),
             f" ({result.error})" if result.error else "")
    return "reviewed"


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
