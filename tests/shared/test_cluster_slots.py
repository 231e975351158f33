"""Redis Cluster readiness: the hash slots of the keys each Lua script (and each multi-key
command outside scripts) touches.

A Redis Cluster runs a script, a MULTI or a multi-key command only when all its keys hash to
one slot (CRC16 of the key, or of its ``{hash tag}``, mod 16384); otherwise it answers
CROSSSLOT. These tests pin down two statements docs/operations/redis-cluster.md makes, so
that neither goes stale silently:

* **today** only the audit scripts (``{audit}`` tag) and the single-key scripts run on a
  Cluster; every conversation script crosses slots;
* **the proposed layout** (each key's ``Key.scope`` below: a conversation's keys, its runs,
  its dedupe marks and its shard of the fleet indexes share the tag ``{s<shard>}``; fleet-wide
  singletons get one tag per store) makes every script single-slot except two, which need
  their script changed: ``accept`` (the per-sender inbound rate) and ``expire_dead`` (the
  fleet's heartbeat hash).

``TABLE`` says, per script, which key builder fills each declared KEYS name; it must cover
``fermix_shared.lua.SCRIPTS`` exactly, and for the conversation queue it is checked against
the KEYS that the real stores send to a real Redis (its SLOWLOG records every EVALSHA).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from redis.cluster import PIPELINE_BLOCKED_COMMANDS
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from fermix_shared import keys, lua
from fermix_shared.agents import lifecycle as agents
from fermix_shared.audit import store as audit_store
from fermix_shared.channels.ratelimit import RateLimiter
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord
from fermix_shared.stores import queue
from fermix_shared.stores.lease import renew_leases
from fermix_shared.usage.periods import PERIODS, Period, bucket_id

# --- samples ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """The ids one call of each script would be made with."""

    conv: str
    run_id: str
    message_id: str
    sender: str
    fanout_id: str
    approval_id: str
    job: str
    chat_limit: str
    when: float = 1_764_547_200.0  # 2025-12-01T00:00:00Z


SAMPLES = [
    Sample("telegram|42|root", "run_0a1b", "1001", "telegram:7", "fan_1", "ap_1", "nightly",
           "telegram:chat:42"),
    Sample("slack|C01|1700000000.0001", "run_9f8e", "Ev02", "slack:U9", "fan_2", "ap_2",
           "digest", "telegram:chat:-100"),
    Sample("http|alice|root", "run_77aa", "m-3", "http:alice", "fan_3", "ap_3", "weekly",
           "telegram:chat:5"),
]

# --- which builder fills each KEYS name --------------------------------------------------------

# Scopes: "conv" (the conversation's own keys, its runs and dedupe marks), "index" (a
# fleet-wide index or registry of conversations, which the proposal splits per shard; "paused"
# is read by accept/claim and would be copied into each shard), "fanout" (one fan-out),
# "sender" (one sender, across conversations), "ratelimit" (one platform's send pace), and
# "group:<name>" (a fleet-wide singleton store: one tag per store).


@dataclass(frozen=True)
class Key:
    scope: str
    build: Callable[[Sample], str | list[str]]


def conv(f: Callable[[str], str]) -> Key:
    return Key("conv", lambda s: f(s.conv))


def run(f: Callable[[str], str]) -> Key:
    return Key("conv", lambda s: f(s.run_id))


def index(f: Callable[[], str]) -> Key:
    return Key("index", lambda s: f())


def group(name: str, build: Callable[[Sample], str]) -> Key:
    return Key(f"group:{name}", build)


def single(name: str, f: Callable[[], str]) -> Key:
    """A fleet-wide singleton key of the store ``name``."""
    return group(name, lambda s: f())


def usage_bucket(period: Period) -> Callable[[Sample], str]:
    return lambda s: keys.usage(period, bucket_id(period, s.when))


ACTIVE, INBOX, STEER, HISTORY = conv(keys.active), conv(keys.inbox), conv(keys.steer), \
    conv(keys.history)
ACTIVE_INDEX, QUEUED_INDEX = index(keys.active_index), index(keys.queued_index)
PAUSED, HELD, LAST_ACTIVE = index(keys.agents_paused), index(keys.agents_held), \
    index(keys.agents_last_active)
KILLED = index(keys.agents_killed)
BEATS = single("fleet", keys.worker_beats)
SUB_RUN = group("fleet", lambda s: keys.subagent_run(s.fanout_id, 0))
SUB_RUNNING = single("fleet", keys.subagents_running)
WORKERS = single("fleet", keys.workers)
MEMORY = {n: single("memory", f) for n, f in (
    ("facts", keys.memory_facts), ("active", keys.memory_active),
    ("archived", keys.memory_archived), ("text_index", keys.memory_text_index))}
APPROVAL = {
    "record": group("approvals", lambda s: keys.approval(s.approval_id)),
    "pending": group("approvals", lambda s: keys.approvals_pending()),
    "by_conv": group("approvals", lambda s: keys.approvals_by_conv()),
}
AUDIT = {n: single("audit", f) for n, f in (
    ("head", keys.audit_head), ("entries", keys.audit_entries), ("anchor", keys.audit_anchor))}

TABLE: dict[str, dict[str, Key]] = {
    "accept": {"mark": Key("conv", lambda s: keys.dedupe(s.conv, s.message_id)),
               "inbox": INBOX, "run": run(keys.run), "active": ACTIVE, "steer": STEER,
               "queued_index": QUEUED_INDEX,
               "sender_rate": Key("sender", lambda s: keys.rate_limit(f"inbound:{s.sender}")),
               "paused": PAUSED, "held": HELD, "conversations": index(keys.conversations),
               "conversation_agents": index(keys.conversation_agents),
               "conv_runs": conv(keys.conv_runs)},
    "stop": {"active": ACTIVE, "inbox": INBOX, "queued_index": QUEUED_INDEX, "steer": STEER,
             "held": HELD},
    "claim": {"active": ACTIVE, "inbox": INBOX, "active_index": ACTIVE_INDEX,
              "queued_index": QUEUED_INDEX, "paused": PAUSED, "held": HELD,
              "last_active": LAST_ACTIVE, "mode": conv(keys.queue_mode)},
    "renew": {"active": ACTIVE, "active_index": ACTIVE_INDEX},
    "take_steer": {"active": ACTIVE, "steer": STEER},
    "park": {"active": ACTIVE, "active_index": ACTIVE_INDEX},
    "unpark": {"active": ACTIVE, "active_index": ACTIVE_INDEX},
    "begin_delivery": {"active": ACTIVE},
    "finish": {"active": ACTIVE, "inbox": INBOX, "run": run(keys.run), "history": HISTORY,
               "active_index": ACTIVE_INDEX, "queued_index": QUEUED_INDEX, "steer": STEER,
               "last_active": LAST_ACTIVE},
    "push_front": {"inbox": INBOX, "queued_index": QUEUED_INDEX},
    "resume_agent": {"paused": PAUSED, "held": HELD},
    "cancel_turn": {"active": ACTIVE},
    "beat": {"beats": BEATS, "workers": WORKERS},
    "expire_dead": {"active": ACTIVE, "active_index": ACTIVE_INDEX, "beats": BEATS},
    "replace_prefix": {"history": HISTORY},
    "put_job": {"jobs": group("sched", lambda s: keys.sched_jobs()),
                "due": group("sched", lambda s: keys.sched_due()),
                "runs": group("sched", lambda s: keys.sched_runs(s.job))},
    "rate_limit": {"limits": Key("ratelimit", lambda s: [keys.rate_limit(s.chat_limit),
                                                         keys.rate_limit("telegram:global")])},
    "memory_add": {n: MEMORY[n] for n in ("facts", "active", "text_index")},
    "memory_update": MEMORY,
    "memory_delete": MEMORY,
    "fanout_semaphore": {"slots": Key("fanout", lambda s: keys.fanout_slots(s.fanout_id)),
                         "wake": Key("fanout", lambda s: keys.fanout_wake(s.fanout_id))},
    "subagent_start": {"run": SUB_RUN, "running": SUB_RUNNING, "beats": BEATS},
    "subagent_finish": {"run": SUB_RUN},
    "subagent_park": {"run": SUB_RUN},
    "subagent_counted": {"run": SUB_RUN, "running": SUB_RUNNING},
    "subagent_requeue": {"run": SUB_RUN, "running": SUB_RUNNING, "beats": BEATS},
    "approval_ask": APPROVAL,
    "approval_decide": {**APPROVAL,
                        "deciding": group("approvals", lambda s: keys.approvals_deciding())},
    "usage_record": {**{p: group("usage", usage_bucket(p)) for p in PERIODS},
                     "unpriced": group("usage", lambda s: keys.usage_unpriced()),
                     "reserved": group("usage", lambda s: keys.usage_reserved()),
                     "reservations": group("usage", lambda s: keys.usage_reservations()),
                     "expiry": group("usage", lambda s: keys.usage_reservation_expiry()),
                     "rate": group("usage", lambda s: keys.usage_rate())},
    "usage_reserve": {**{p: group("usage", usage_bucket(p)) for p in PERIODS},
                      "budgets": group("usage", lambda s: keys.budgets()),
                      "reserved": group("usage", lambda s: keys.usage_reserved()),
                      "reservations": group("usage", lambda s: keys.usage_reservations()),
                      "expiry": group("usage", lambda s: keys.usage_reservation_expiry()),
                      "rate": group("usage", lambda s: keys.usage_rate())},
    "audit_append": {n: AUDIT[n] for n in ("head", "entries")},
    "audit_trim": AUDIT,
    "record_append": {"record": group("record", lambda s: keys.run_record(s.run_id)),
                      "size": group("record", lambda s: keys.run_record_size(s.run_id))},
}

# Multi-key commands outside scripts: MULTI/EXEC with several keys, and a DEL of two.
MULTI_KEY: dict[str, dict[str, Key]] = {
    # fermix_shared/stores/status.py: the status snapshot (transaction=True).
    "status_snapshot": {"active_index": ACTIVE_INDEX, "queued_index": QUEUED_INDEX,
                        "workers": WORKERS,
                        "paused": PAUSED, "last_active": LAST_ACTIVE, "killed": KILLED},
    # fermix_cli/doctor/redis_checks.py read_fleet (transaction=True), RedBeat's lock included:
    # RedBeat stays with the Celery broker, on a Redis of its own (see docs/operations/redis-cluster.md).
    "doctor_read_fleet": {"beats": BEATS, "workers": WORKERS,
                          "beat_lock": Key("broker", lambda s: "redbeat::lock")},
    # fermix_gateway/commands.py /new: DEL history and the last prompt size.
    "new_deletes": {"history": HISTORY, "usage": conv(keys.conv_usage)},
}

# --- slots today and under the proposal -------------------------------------------------------

SHARDS = 256
"""The proposal's number of conversation shards (fixed per deployment)."""


def shard_tag(conv_str: str) -> str:
    """The proposal's hash tag for a conversation: its shard, ``s0`` .. ``s255``, from
    ``channel|chat_id`` (a chat's threads, and a job's runs ``schedule|NAME|RUN``, share it:
    a scheduled run's id can name its shard before the id exists)."""
    channel, chat_id, _scope = conv_str.split("|", 2)
    return f"s{key_slot(f'{channel}|{chat_id}'.encode()) % SHARDS}"


def proposed_tag(key: Key, s: Sample) -> str:
    """The hash tag the proposed layout gives ``key`` in a call made for ``s``."""
    match key.scope:
        case "conv" | "index":
            return shard_tag(s.conv)
        case "fanout":
            return f"fanout:{s.fanout_id}"
        case "sender":
            return f"sender:{s.sender}"
        case "ratelimit":
            return "rl:telegram"
        case _:
            return key.scope.removeprefix("group:")


def built(key: Key, s: Sample) -> list[str]:
    out = key.build(s)
    return out if isinstance(out, list) else [out]


def off_slot(table: dict[str, Key], slot_of: Callable[[Key, str, Sample], int]) -> set[str]:
    """The key names that, in some sample, hash elsewhere than the call's first key."""
    out: set[str] = set()
    for s in SAMPLES:
        slots = {name: {slot_of(k, b, s) for b in built(k, s)} for name, k in table.items()}
        home = next(iter(next(iter(slots.values()))))
        out |= {name for name, got in slots.items() if got != {home}}
    return out


def today(key: Key, name: str, s: Sample) -> int:
    return key_slot(name.encode())


def proposed(key: Key, name: str, s: Sample) -> int:
    return key_slot(proposed_tag(key, s).encode())


def test_the_table_names_every_script_and_every_declared_key() -> None:
    assert sorted(TABLE) == sorted(s.name for s in lua.SCRIPTS)
    for script in lua.SCRIPTS:
        assert list(TABLE[script.name]) == [n.removeprefix("*") for n in script.keys], script.name


SINGLE_SLOT_TODAY = {"audit_append", "audit_trim", "begin_delivery", "cancel_turn",
                     "record_append", "replace_prefix", "subagent_finish", "subagent_park"}


def test_today_only_the_audit_and_single_key_scripts_stay_in_one_slot() -> None:
    single = {n for n, t in TABLE.items() if not off_slot(t, today)}
    assert single == SINGLE_SLOT_TODAY
    # Each conversation script crosses slots even between the conversation's own keys.
    for name in ("accept", "claim", "finish", "stop", "take_steer", "push_front", "renew"):
        own = {n: k for n, k in TABLE[name].items() if k.scope == "conv"}
        if len(own) > 1:
            assert off_slot(own, today), name
    # And none of the multi-key commands outside scripts would run either.
    assert {n for n, t in MULTI_KEY.items() if not off_slot(t, today)} == set()


CROSS_SLOT_UNDER_PROPOSAL = {
    # A sender's inbound rate spans its conversations: checked in a script of its own first.
    "accept": {"sender_rate"},
    # The fleet's heartbeat hash: the reaper passes the beat it read as ARGV instead (the
    # lease's fencing already makes acting on a stale read safe).
    "expire_dead": {"beats"},
}


def test_the_proposed_layout_leaves_two_scripts_to_change() -> None:
    cross = {n: got for n, t in TABLE.items() if (got := off_slot(t, proposed))}
    assert cross == CROSS_SLOT_UNDER_PROPOSAL
    # Outside scripts: the snapshot reads per shard without a transaction; doctor reads the
    # beat lock from the broker's Redis; /new's DEL is in one slot.
    assert {n: got for n, t in MULTI_KEY.items() if (got := off_slot(t, proposed))} == {
        "status_snapshot": {"workers"}, "doctor_read_fleet": {"beat_lock"}}


def test_shard_tags_spread_over_a_three_node_cluster() -> None:
    slots = [key_slot(f"s{i}".encode()) for i in range(SHARDS)]
    assert len(set(slots)) == SHARDS
    third = REDIS_CLUSTER_HASH_SLOTS / 3
    per_node = [sum(1 for x in slots if n * third <= x < (n + 1) * third) for n in range(3)]
    assert min(per_node) >= SHARDS // 5, per_node  # no master owns less than a fifth


def test_a_conversation_string_cannot_open_a_hash_tag_of_its_own() -> None:
    # Chat ids may hold braces (HTTP chatId), so today "{x}" would choose its keys' slot (the
    # first {...} is the tag); the proposal's tag comes first in every key, so it always wins.
    assert ConversationKey.valid_part("{x}")
    k = keys.inbox("http|{x}|root")
    assert key_slot(k.encode()) == key_slot(b"x")
    tagged = f"fx:{{{shard_tag('http|{x}|root')}}}:conv:http|{{x}}|root:inbox"
    assert key_slot(tagged.encode()) == key_slot(shard_tag("http|{x}|root").encode())


# --- the table against the real stores --------------------------------------------------------

_BY_SHA = {hashlib.sha1(s.source.encode()).hexdigest(): s.name for s in lua.SCRIPTS}


@contextmanager
def evalsha_log(r: redis.Redis) -> Iterator[dict[str, list[str]]]:
    """The KEYS of every EVALSHA Redis ran inside the block, by script name (SLOWLOG with a
    zero threshold records every command; keys hold no spaces)."""
    saved: dict[str, str] = r.config_get("slowlog-*")  # type: ignore[assignment]
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 4096)
    r.slowlog_reset()
    calls: dict[str, list[str]] = {}
    try:
        yield calls
        for entry in r.slowlog_get(4096):
            words = entry["command"].decode().split(" ")
            if words[0].upper() == "EVALSHA" and words[1] in _BY_SHA:
                calls[_BY_SHA[words[1]]] = words[3:3 + int(words[2])]
    finally:
        for name, value in saved.items():
            r.config_set(name, value)


def test_the_stores_send_the_keys_the_table_names(r: redis.Redis, scratch_redis_url: str
                                                  ) -> None:
    s = SAMPLES[0]
    key = ConversationKey.parse(s.conv)
    with evalsha_log(r) as calls:
        msg = InboundMessage(key=key, text="hi", run_id=s.run_id)
        queue.accept(r, msg, message_id=s.message_id,
                     limits=queue.AcceptLimits(sender=s.sender, per_minute=10))
        _, lease = queue.claim(r, s.conv, "w1", 30)
        assert lease is not None
        assert not isinstance(renew_leases([lease])[0], Exception)
        lease.take_steered()
        assert lease.park(30)
        back = queue.unpark(r, s.conv, lease.turn_id, "w1", 30)
        assert back is not None
        lease = back[1]
        lease.begin_delivery()
        lease.finish(RunRecord(run_id=s.run_id, conversation=key), [], 100, deliver=True)
        queue.push_front(r, InboundMessage(key=key, text="again"))
        asyncio.run(_stop(scratch_redis_url, s.conv))
        agents.resume(r, "default")
        audit_store.append(r, {"event": "cluster-test"})
        RateLimiter(r, sleep=lambda _: None).acquire([(s.chat_limit, 0.001),
                                                       ("telegram:global", 0.001)])
    expected = {name: [k for key_ in TABLE[name].values() for k in built(key_, s)]
                for name in calls}
    assert set(calls) == {"accept", "claim", "renew", "take_steer", "park", "unpark",
                          "begin_delivery", "finish", "push_front", "stop", "resume_agent",
                          "audit_append", "rate_limit"}
    assert calls == expected


async def _stop(url: str, conv_str: str) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await queue.stop_async(client, conv_str)
    finally:
        await client.aclose()



def test_redis_py_refuses_evalsha_in_a_cluster_pipeline() -> None:
    # The lease renewer (stores.lease.renew_leases) pipelines plain EVALSHA, one per lease: a
    # RedisCluster pipeline refuses that command, so on a Cluster the renewer must pipeline
    # per node on that node's own client (every lease's keys being in one slot).
    assert "EVALSHA" in PIPELINE_BLOCKED_COMMANDS
