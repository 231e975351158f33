"""The memory review, coalesced per conversation: turns are queued, the review is due after a
quiet period (or at once past a batch size), the reaper starts each due review once, and one
model call reviews every pending turn of the conversation. Real Redis, the real review over the
real SDK against the scripted model."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_shared import keys
from fermix_shared.memory import MemoryStore
from fermix_shared.memory.reviews import queue_review, start_due_reviews
from fermix_shared.messages import ChatMessage
from fermix_shared.settings import get_settings
from fermix_worker.loop_state import LoopState
from fermix_worker.memory import reviewer as reviewer_module
from fermix_worker.memory.review import REVIEW_SYSTEM
from fermix_worker.memory.reviewer import MemoryReviewer, ReviewOutcome
from fermix_worker.providers import get_router
from fermix_worker.turn.checkpoints import Checkpoints
from tests.conftest import provider_env


@pytest.fixture
def worker_env(r: redis.Redis, llm: ScriptedLLMServer,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in provider_env(llm, "openai").items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def review_conversation(r: redis.Redis, conv: str) -> ReviewOutcome:
    """What ``fermix.memory.review_conversation`` runs, on this test's Redis."""
    return MemoryReviewer(r, lambda: get_router(get_settings())).review_conversation(conv)


def conv_key() -> str:
    return f"telegram|{uuid.uuid4().hex[:8]}|root"


def delivered_turn(r: redis.Redis, user: str, answer: str) -> str:
    run_id = "run_" + uuid.uuid4().hex
    state = LoopState.start(run_id=run_id, model="scripted-openai", system="s", history=[],
                            user=ChatMessage(role="user", content=user))
    state.messages.append(ChatMessage(role="assistant", content=answer))
    Checkpoints(r).save(state)
    return run_id


def due_at(r: redis.Redis, conv: str) -> float | None:
    return r.zscore(keys.memory_review_due(), conv)


def test_each_turn_pushes_the_review_back_until_the_batch_is_full(r: redis.Redis) -> None:
    conv = conv_key()
    queue_review(r, "run_1", conv, "default", "telegram:42", 30, 3, now_ms=1_000_000)
    assert due_at(r, conv) == 1_030_000
    queue_review(r, "run_2", conv, "default", "telegram:42", 30, 3, now_ms=1_010_000)
    assert due_at(r, conv) == 1_040_000  # quiet again from the latest turn
    queue_review(r, "run_3", conv, "default", "telegram:42", 30, 3, now_ms=1_020_000)
    assert due_at(r, conv) == 1_020_000  # three waiting: due now
    assert r.llen(keys.memory_pending(conv)) == 3


def test_a_due_review_is_started_once_whoever_scans(r: redis.Redis) -> None:
    early, late = conv_key(), conv_key()
    r.zadd(keys.memory_review_due(), {early: 5_000, late: 50_000})
    started: list[str] = []
    barrier = threading.Barrier(4)

    def scan() -> None:
        barrier.wait()
        start_due_reviews(r, started.append, now_ms=10_000)

    threads = [threading.Thread(target=scan) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert started.count(early) == 1 and late not in started
    assert due_at(r, late) == 50_000
    r.zrem(keys.memory_review_due(), late)


@pytest.mark.usefixtures("worker_env")
def test_one_model_call_reviews_every_pending_turn(r: redis.Redis, llm: ScriptedLLMServer) -> None:
    conv, token = conv_key(), uuid.uuid4().hex[:8]
    runs = [delivered_turn(r, f"My cat is called Tom {token}", "Nice."),
            delivered_turn(r, f"I live in Lyon {token}", "Noted."),
            delivered_turn(r, f"I moved to Paris {token}", "Got it.")]
    for run_id in runs:
        queue_review(r, run_id, conv, "default", "telegram:42", 30, 10)
    plan = {"add": ["The user's cat is called Tom.", "The user lives in Paris."],
            "replace": [], "archive": []}
    llm.script.push(Reply(json.dumps(plan), match=token))
    assert review_conversation(r, conv) == "reviewed"
    reviews = [q for q in llm.script.requests if token in json.dumps(q["body"])]
    assert len(reviews) == 1  # three turns, one review
    body: Any = reviews[0]["body"]
    assert body["messages"][0]["content"].startswith(REVIEW_SYSTEM[:60])
    exchange = json.dumps(body)
    assert all(f"{text} {token}" in exchange for text in (
        "My cat is called Tom", "I live in Lyon", "I moved to Paris"))
    assert {f.text for f in MemoryStore(r).active()} >= set(plan["add"])
    assert r.llen(keys.memory_pending(conv)) == 0
    # A review of nothing new makes no model call.
    assert review_conversation(r, conv) == "duplicate"
    assert len([q for q in llm.script.requests if token in json.dumps(q["body"])]) == 1


@pytest.mark.usefixtures("worker_env")
def test_turns_that_arrive_during_a_review_wait_for_the_next(
    r: redis.Redis, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv, token = conv_key(), uuid.uuid4().hex[:8]
    first = delivered_turn(r, f"I like tea {token}", "Nice.")
    queue_review(r, first, conv, "default", "telegram:42", 30, 10)
    late = delivered_turn(r, f"I like coffee too {token}", "Nice.")
    real = reviewer_module.review_mod.review_turn

    def review_then_a_turn_lands(*args: Any, **kwargs: Any) -> Any:
        queue_review(r, late, conv, "default", "telegram:42", 30, 10)
        return real(*args, **kwargs)

    monkeypatch.setattr(reviewer_module.review_mod, "review_turn", review_then_a_turn_lands)
    llm.script.push(Reply(json.dumps({"add": [], "replace": [], "archive": []}), match=token))
    assert review_conversation(r, conv) == "reviewed"
    pending = [json.loads(e)["run_id"] for e in r.lrange(keys.memory_pending(conv), 0, -1)]
    assert pending == [late]
    assert due_at(r, conv) is not None and due_at(r, conv) > time.time() * 1000  # type: ignore[operator]
