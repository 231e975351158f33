"""Agent lifecycle in Redis: a paused agent's messages are held at the inbox head (never taken,
never dropped), resume releases each held conversation exactly once, and a pause racing the
fleet's claims loses nothing. Scratch Redis, no workers."""

from __future__ import annotations

import asyncio
import queue as queues
import random
import threading
import uuid

import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.agents import lifecycle as agents
from fermix_shared.agents.definitions import IDLE_AFTER_SECONDS
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord
from fermix_shared.stores import queue
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.status import AgentActivity, queue_status
from fermix_worker.fleet.reaper import stale_conversations
from tests.seed_text import quoted

LEASE_S = 30.0
NOW_MS = 1_700_000_000_000


def conv_key() -> ConversationKey:
    return ConversationKey(channel="http", chat_id=uuid.uuid4().hex[:8])


def send(r: redis.Redis, key: ConversationKey, text: str, agent: str = "default",
         **extra: object) -> InboundMessage:
    msg = InboundMessage(key=key, text=text, agent=agent, **extra)  # type: ignore[arg-type]
    assert queue.accept(r, msg).new
    return msg


def inbox(r: redis.Redis, key: ConversationKey) -> list[str]:
    raw = r.lrange(keys.inbox(key.as_str()), 0, -1)
    return [InboundMessage.model_validate_json(m).text for m in raw]


def finish(r: redis.Redis, lease: TurnLease) -> int:
    rec = RunRecord(run_id=lease.turn_id, conversation=ConversationKey.parse(lease.conv))
    released = lease.finish(rec, [], 100, deliver=False)
    return int(getattr(released, "waiting", 0))


# --- claim holds a paused agent's head ----------------------------------------------------------


def test_a_paused_agents_message_is_held_not_claimed_and_another_agent_runs(r: redis.Redis) -> None:
    ops, other = conv_key(), conv_key()
    send(r, ops, "one", "ops")
    send(r, ops, "two", "ops")
    send(r, other, "hello")
    assert agents.pause(r, "ops", NOW_MS) == NOW_MS
    claim, lease = queue.claim(r, ops.as_str(), "w1", LEASE_S)
    assert (claim.kind, claim.agent, claim.messages, lease) == ("paused", "ops", [], None)
    assert inbox(r, ops) == ["one", "two"], "nothing taken, nothing dropped"
    assert r.zscore(keys.queued_index(), ops.as_str()) is not None, "still counted as waiting"
    assert not r.exists(keys.active(ops.as_str()))
    assert r.zscore(keys.active_index(), ops.as_str()) is None
    assert r.hgetall(keys.agents_held()) == {ops.as_str(): "ops"}
    claim, _ = queue.claim(r, other.as_str(), "w1", LEASE_S)
    assert claim.kind == "claimed" and claim.messages[0].text == "hello"


def test_pausing_twice_keeps_the_first_pause(r: redis.Redis) -> None:
    assert agents.pause(r, "ops", NOW_MS) == NOW_MS
    assert agents.pause(r, "ops", NOW_MS + 5000) == NOW_MS
    assert r.hgetall(keys.agents_paused()) == {"ops": str(NOW_MS)}


def test_collect_mode_merges_one_agents_messages_and_stops_at_a_paused_one(r: redis.Redis) -> None:
    key = conv_key()
    for text, agent in (("a1", "default"), ("a2", "default"), ("o1", "ops"), ("a3", "default")):
        send(r, key, text, agent)
    agents.pause(r, "ops", NOW_MS)
    claim, lease = queue.claim(r, key.as_str(), "w1", LEASE_S, collect=True)
    assert claim.kind == "claimed" and [m.text for m in claim.messages] == ["a1", "a2"]
    assert lease is not None and finish(r, lease) == 2
    claim, _ = queue.claim(r, key.as_str(), "w1", LEASE_S, collect=True)
    assert claim.kind == "paused", "the paused agent's message is next: nothing runs past it"
    assert inbox(r, key) == ["o1", "a3"]
    (released,) = [agents.resume(r, "ops").conversations]
    assert released == [key.as_str()]
    claim, _ = queue.claim(r, key.as_str(), "w1", LEASE_S, collect=True)
    assert [m.text for m in claim.messages] == ["o1"], "a turn answers as one agent"


def test_a_compaction_job_is_not_held_by_a_pause(r: redis.Redis) -> None:
    key = conv_key()
    send(r, key, "later", "ops")
    queue.push_front(r, InboundMessage(key=key, text="/compact", kind="compact", agent="ops"))
    agents.pause(r, "ops", NOW_MS)
    claim, lease = queue.claim(r, key.as_str(), "w1", LEASE_S)
    assert claim.kind == "claimed" and claim.messages[0].kind == "compact"
    assert lease is not None and finish(r, lease) == 1
    assert queue.claim(r, key.as_str(), "w1", LEASE_S)[0].kind == "paused"
    assert r.hget(keys.agents_last_active(), "ops") is None, "a compaction is not the agent's turn"


def test_a_running_turn_whose_worker_died_still_resumes_while_paused(r: redis.Redis) -> None:
    key = conv_key()
    msg = send(r, key, "started", "ops")
    claim, lease = queue.claim(r, key.as_str(), "dead", LEASE_S)
    assert claim.kind == "claimed" and lease is not None
    agents.pause(r, "ops", NOW_MS)
    r.hset(keys.active(key.as_str()), "lease_until", 0)
    claim, lease = queue.claim(r, key.as_str(), "live", LEASE_S)
    assert claim.kind == "orphan" and claim.messages[0].run_id == msg.run_id


def test_steer_mode_queues_a_paused_agents_message_instead_of_steering(r: redis.Redis) -> None:
    key = conv_key()
    send(r, key, "running", "ops")
    queue.claim(r, key.as_str(), "w1", LEASE_S)
    agents.pause(r, "ops", NOW_MS)
    late = InboundMessage(key=key, text="steer me", agent="ops")
    assert queue.accept(r, late, mode="steer").code is queue.AcceptCode.queued
    assert inbox(r, key) == ["steer me"] and r.llen(keys.steer(key.as_str())) == 0
    agents.resume(r, "ops")
    other = InboundMessage(key=key, text="steered", agent="ops")
    assert queue.accept(r, other, mode="steer").code is queue.AcceptCode.steered


def test_stop_clears_what_a_pause_held(r: redis.Redis, scratch_redis_url: str) -> None:
    key = conv_key()
    send(r, key, "one", "ops")
    agents.pause(r, "ops", NOW_MS)
    queue.claim(r, key.as_str(), "w1", LEASE_S)

    async def stop() -> queue.StopResult:
        client = aioredis.Redis.from_url(scratch_redis_url, decode_responses=True)
        try:
            return await queue.stop_async(client, key.as_str())
        finally:
            await client.aclose()

    assert [m.text for m in asyncio.run(stop()).cleared] == ["one"]
    assert r.hgetall(keys.agents_held()) == {}


# --- resume ---------------------------------------------------------------------------------


def test_resume_returns_each_held_conversation_exactly_once(r: redis.Redis) -> None:
    a, b, c = conv_key(), conv_key(), conv_key()
    send(r, a, "a", "ops")
    send(r, b, "b", "ops")
    send(r, c, "c", "triage")
    agents.pause(r, "ops", NOW_MS)
    agents.pause(r, "triage", NOW_MS)
    for key in (a, b, c):
        assert queue.claim(r, key.as_str(), "w1", LEASE_S)[0].kind == "paused"
        assert queue.claim(r, key.as_str(), "w2", LEASE_S)[0].kind == "paused"  # no duplicate
    first = agents.resume(r, "ops")
    assert first.was_paused and sorted(first.conversations) == sorted([a.as_str(), b.as_str()])
    assert agents.resume(r, "ops") == agents.Resumed(False, [])
    assert r.hgetall(keys.agents_held()) == {c.as_str(): "triage"}, "another pause keeps its own"
    assert r.hgetall(keys.agents_paused()).keys() == {"triage"}
    for key in (a, b):
        assert queue.claim(r, key.as_str(), "w1", LEASE_S)[0].kind == "claimed"


def test_a_paused_agents_three_messages_run_in_order_after_resume(r: redis.Redis) -> None:
    key = conv_key()
    agents.pause(r, "ops", NOW_MS)
    sent = [send(r, key, f"m{i}", "ops").run_id for i in range(3)]
    assert queue.claim(r, key.as_str(), "w1", LEASE_S)[0].kind == "paused"
    assert agents.resume(r, "ops").conversations == [key.as_str()]
    ran = []
    while (taken := queue.claim(r, key.as_str(), "w1", LEASE_S))[0].kind == "claimed":
        ran.append(taken[0].messages[0].run_id)
        assert taken[1] is not None
        finish(r, taken[1])
    assert ran == sent


def test_a_pause_racing_the_fleets_claims_never_loses_a_conversation(r: redis.Redis) -> None:
    """Five dispatching threads and a thread pausing and resuming: every message runs exactly
    once and in order, with no wake-up but finish's "more waiting" and resume's release."""
    convs = [conv_key() for _ in range(20)]
    sent = {k.as_str(): [send(r, k, f"{k.chat_id}-{i}", "ops").run_id for i in range(5)]
            for k in convs}
    kicks: queues.Queue[str | None] = queues.Queue()
    ran: dict[str, list[str]] = {c: [] for c in sent}
    outcomes: list[str] = []
    lock = threading.Lock()
    client = redis.Redis(connection_pool=r.connection_pool)

    def dispatcher() -> None:
        while (conv := kicks.get()) is not None:
            try:
                claim, lease = queue.claim(client, conv, threading.current_thread().name, LEASE_S)
                with lock:
                    outcomes.append(claim.kind)
                if lease is not None:
                    with lock:
                        ran[conv].append(claim.messages[0].run_id)
                    if finish(client, lease) > 0:
                        kicks.put(conv)
            finally:
                kicks.task_done()

    def toggler(rounds: int) -> None:
        rng = random.Random(7)
        for _ in range(rounds):
            agents.pause(client, "ops", NOW_MS)
            for conv in agents.resume(client, "ops").conversations if rng.random() < 0.5 else []:
                kicks.put(conv)
            for conv in agents.resume(client, "ops").conversations:
                kicks.put(conv)

    workers = [threading.Thread(target=dispatcher, name=f"w{i}") for i in range(5)]
    for w in workers:
        w.start()
    toggle = threading.Thread(target=toggler, args=(1000,))
    toggle.start()
    for conv in sent:
        kicks.put(conv)
    toggle.join()
    for conv in agents.resume(client, "ops").conversations:  # the last word is a resume
        kicks.put(conv)
    kicks.join()
    for _ in workers:
        kicks.put(None)
    for w in workers:
        w.join()
    assert ran == sent
    assert "paused" in outcomes, "the pause did hold some conversations"
    assert r.hgetall(keys.agents_held()) == {} and r.zcard(keys.queued_index()) == 0


# --- activity and state -----------------------------------------------------------------------


def test_claim_and_finish_stamp_the_agents_last_activity(r: redis.Redis) -> None:
    key = conv_key()
    send(r, key, "hi", "ops")
    claim, lease = queue.claim(r, key.as_str(), "w1", LEASE_S)
    started = int(r.hget(keys.agents_last_active(), "ops") or 0)
    assert started > 0 and lease is not None
    r.hset(keys.agents_last_active(), "ops", 1)
    finish(r, lease)
    assert int(r.hget(keys.agents_last_active(), "ops") or 0) >= started


def test_the_state_is_paused_active_idle_or_created() -> None:
    idle_ms = int(IDLE_AFTER_SECONDS * 1000)

    def state(**kw: object) -> str:
        args = {"paused": False, "active": 0, "pending": 0, "last_active_ms": None,
                "now_ms": NOW_MS, **kw}
        return agents.agent_state(**args)  # type: ignore[arg-type]

    assert state() == "created"
    assert state(pending=1) == "active"
    assert state(active=1, last_active_ms=NOW_MS - 10 * idle_ms) == "active"
    assert state(last_active_ms=NOW_MS - idle_ms + 1) == "active"
    assert state(last_active_ms=NOW_MS - idle_ms) == "idle"
    assert state(paused=True, active=1, pending=3) == "paused"
    assert state(killed=True, paused=True, active=1, pending=3) == "killed"
    # The seed's diagram: "Active --> Idle: No messages for 5 min", "Killed --> [*]".
    quoted("O", "Active --> Idle: No messages for 5 min")
    quoted("O", "Killed, // Permanently stopped")
    assert IDLE_AFTER_SECONDS == 5 * 60
    assert state(last_active_ms=NOW_MS - 5 * 60_000 + 1) == "active"
    assert state(last_active_ms=NOW_MS - 5 * 60_000) == "idle"


def test_status_counts_each_agents_active_and_pending(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    busy, waiting = conv_key(), conv_key()
    send(r, busy, "running", "ops")
    send(r, busy, "next", "ops")
    send(r, busy, "after", "default")
    queue.claim(r, busy.as_str(), "w1", LEASE_S)
    send(r, waiting, "w1", "triage")
    queue.push_front(r, InboundMessage(key=waiting, text="/compact", kind="compact"))
    agents.pause(r, "triage", NOW_MS)
    r.hset(keys.agents_last_active(), mapping={"ops": NOW_MS, "idler": NOW_MS - 301_000})
    names = ["default", "ops", "triage", "idler", "fresh"]

    async def read() -> tuple[AgentActivity, ...]:
        client = aioredis.Redis.from_url(scratch_redis_url, decode_responses=True)
        try:
            return (await queue_status(client, now=NOW_MS / 1000, agents=names)).agents
        finally:
            await client.aclose()

    assert asyncio.run(read()) == (
        AgentActivity("default", "active", 0, 1),
        AgentActivity("ops", "active", 1, 1, last_active_at=NOW_MS),
        AgentActivity("triage", "paused", 0, 1, paused_at=NOW_MS),
        AgentActivity("idler", "idle", 0, 0, last_active_at=NOW_MS - 301_000),
        AgentActivity("fresh", "created", 0, 0),
    )


# --- the reaper -------------------------------------------------------------------------------


def test_the_reaper_leaves_held_conversations_to_the_resume(r: redis.Redis) -> None:
    held, stale = conv_key(), conv_key()
    send(r, held, "h", "ops")
    send(r, stale, "s", "default")
    agents.pause(r, "ops", NOW_MS)
    assert queue.claim(r, held.as_str(), "w1", LEASE_S)[0].kind == "paused"
    r.zadd(keys.queued_index(), {held.as_str(): 1, stale.as_str(): 1})  # both waited long
    assert stale_conversations(r, LEASE_S) == [stale.as_str()]
    # A held entry whose agent is no longer paused holds nothing back.
    r.hdel(keys.agents_paused(), "ops")
    assert sorted(stale_conversations(r, LEASE_S)) == sorted([held.as_str(), stale.as_str()])
