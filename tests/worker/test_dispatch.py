"""Dispatcher decisions for a turn whose worker died, on a real Redis (no Celery needed)."""

from __future__ import annotations

import redis

from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_worker.tools import ToolRegistry
from fermix_worker.turn import GENERIC_ERROR, STOPPED_MARKER, TurnRunner
from fermix_worker.turn.close import FAILED_MARKER
from fermix_worker.turn.dispatch import Dispatcher


def no_router() -> object:
    raise AssertionError("closing an orphan must not call a model")


def orphaned(r: redis.Redis, conv: ConversationKey, attempt: int, cancelled: str = "") -> InboundMessage:
    """A turn claimed by a worker that then died: its lease already lapsed."""
    msg = InboundMessage(key=conv, text="hello")
    queue.accept(r, msg)
    queue.accept(r, InboundMessage(key=conv, text="next"))
    claim, _ = queue.claim(r, conv.as_str(), "dead-worker:1", 30)
    assert claim.kind == "claimed"
    active = keys.active(conv.as_str())
    r.hset(active, mapping={"lease_until": 0, "attempt": attempt - 1})
    if cancelled:
        r.hset(active, "cancelled", cancelled)
    return msg


def dispatcher(r: redis.Redis, kicked: list[str], **settings: object) -> Dispatcher:
    s = Settings(redis_url="redis://unused", **settings)  # type: ignore[arg-type]
    runner = TurnRunner(r, s, ToolRegistry([]), router=no_router)  # type: ignore[arg-type]
    return Dispatcher(r, s, runner, "live-worker:2", kicked.append)


def test_past_the_attempt_bound_the_user_gets_the_generic_error_and_the_chat_moves_on(
    r: redis.Redis,
) -> None:
    conv = ConversationKey(channel="http", chat_id="c1")
    msg = orphaned(r, conv, attempt=4)
    kicked: list[str] = []
    assert dispatcher(r, kicked, turn_max_attempts=3).dispatch(conv.as_str()) == "orphan"
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status == "error" and rec.error == GENERIC_ERROR
    assert kicked == [conv.as_str()], "the next message is dispatched"
    said = [m.content for m in history.load_all(r, conv.as_str())[1]]
    # A crashed turn is never committed (seed): the marker keeps the message from being
    # answered again, and the error the user got stays out of history.
    assert said[-1] == FAILED_MARKER and GENERIC_ERROR not in said
    assert not r.exists(keys.active(conv.as_str()))


def test_a_resumable_turn_without_a_checkpoint_is_closed_not_rerun(r: redis.Redis) -> None:
    conv = ConversationKey(channel="http", chat_id="c2")
    msg = orphaned(r, conv, attempt=2)
    dispatcher(r, []).dispatch(conv.as_str())
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status == "error" and rec.error == GENERIC_ERROR


def test_a_cancelled_turn_whose_worker_died_ends_stopped_with_the_marker(r: redis.Redis) -> None:
    conv = ConversationKey(channel="http", chat_id="c3")
    msg = orphaned(r, conv, attempt=2, cancelled="stop")
    dispatcher(r, []).dispatch(conv.as_str())
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.status == "stopped" and rec.reply is None
    hist = [ChatMessage.model_validate_json(x) for x in r.lrange(keys.history(conv.as_str()), 0, -1)]
    assert [m.content for m in hist] == [STOPPED_MARKER]


def test_a_live_lease_is_left_alone(r: redis.Redis) -> None:
    conv = ConversationKey(channel="http", chat_id="c4")
    queue.accept(r, InboundMessage(key=conv, text="hello"))
    queue.claim(r, conv.as_str(), "busy-worker:1", 30)
    assert dispatcher(r, []).dispatch(conv.as_str()) == "busy"
