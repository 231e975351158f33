"""Every Lua script Fermix runs in Redis, declared once with the names of its KEYS and ARGV.

Each multi-key change that must be atomic is one ``.lua`` file in this folder; the header of
the file describes each ``KEYS[n]`` and ``ARGV[n]`` under the name it has here, and
``tests/shared/test_lua.py`` holds the two to each other. Stores call a script with keywords
(see :class:`~fermix_shared.lua.script.LuaScript`)::

    from fermix_shared import lua

    lua.CLAIM(r, active=..., inbox=..., active_index=..., queued_index=..., paused=...,
              held=..., last_active=..., worker=..., lease_ms=..., now_ms=..., conv=...,
              collect="0")
"""

from __future__ import annotations

from fermix_shared.lua.script import Arg, LuaScript

__all__ = [
    "ACCEPT", "APPROVAL_ASK", "APPROVAL_DECIDE", "AUDIT_APPEND", "AUDIT_TRIM",
    "BEAT", "BEGIN_DELIVERY", "CANCEL_TURN", "CLAIM", "EXPIRE_DEAD",
    "FANOUT_SEMAPHORE", "FINISH", "MEMORY_ADD", "MEMORY_DELETE", "MEMORY_UPDATE", "PARK",
    "PUSH_FRONT", "PUT_JOB", "RATE_LIMIT", "RECORD_APPEND", "RENEW", "REPLACE_PREFIX", "RESUME_AGENT", "SCRIPTS",
    "STOP", "SUBAGENT_COUNTED", "SUBAGENT_FINISH", "SUBAGENT_PARK", "SUBAGENT_REQUEUE",
    "SUBAGENT_START",
    "TAKE_STEER", "UNPARK", "USAGE_RECORD", "USAGE_RESERVE", "Arg", "LuaScript",
]

# The conversation queue (fermix_shared/stores/queue.py): one active turn per conversation.
ACCEPT = LuaScript(
    "accept",
    keys=("mark", "inbox", "run", "active", "steer", "queued_index", "sender_rate", "paused",
          "held", "conversations", "conversation_agents", "conv_runs"),
    args=("run_id", "message", "record", "dedupe_ttl_s", "run_ttl_s", "has_mark", "mode", "conv",
          "now_ms", "max_queued", "rate_count", "rate_period_ms", "agent"),
)
STOP = LuaScript(
    "stop",
    keys=("active", "inbox", "queued_index", "steer", "held"),
    args=("reason", "conv"),
)
CLAIM = LuaScript(
    "claim",
    keys=("active", "inbox", "active_index", "queued_index", "paused", "held", "last_active",
          "mode"),
    args=("worker", "lease_ms", "now_ms", "conv", "collect"),
)
RENEW = LuaScript(
    "renew",
    keys=("active", "active_index"),
    args=("turn_id", "worker", "lease_ms", "now_ms", "conv"),
)
TAKE_STEER = LuaScript(
    "take_steer",
    keys=("active", "steer"),
    args=("turn_id", "worker"),
)
PARK = LuaScript(
    "park",
    keys=("active", "active_index"),
    args=("turn_id", "worker", "lease_until_ms", "conv"),
)
UNPARK = LuaScript(
    "unpark",
    keys=("active", "active_index"),
    args=("turn_id", "worker", "lease_ms", "now_ms", "conv"),
)
BEGIN_DELIVERY = LuaScript(
    "begin_delivery",
    keys=("active",),
    args=("turn_id", "worker", "mark"),
)
FINISH = LuaScript(
    "finish",
    keys=("active", "inbox", "run", "history", "active_index", "queued_index", "steer",
          "last_active"),
    args=("turn_id", "worker", "record", "run_ttl_s", "history_cap", "conv", "now_ms", "mode",
          "*entries"),
)
PUSH_FRONT = LuaScript(
    "push_front",
    keys=("inbox", "queued_index"),
    args=("message", "conv", "now_ms"),
)

# Agent lifecycle (fermix_shared/agents/lifecycle.py): resuming releases what the pause held.
RESUME_AGENT = LuaScript(
    "resume_agent",
    keys=("paused", "held"),
    args=("agent",),
)
# Killing an agent cancels each of its active turns, one conversation at a time.
CANCEL_TURN = LuaScript(
    "cancel_turn",
    keys=("active",),
    args=("turn_id", "reason"),
)

# Worker liveness (fermix_worker/fleet/reaper.py): heartbeats, and the turns of a worker that
# stopped beating.
BEAT = LuaScript(
    "beat",
    keys=("beats", "workers"),
    args=("worker", "node", "seen"),
)
EXPIRE_DEAD = LuaScript(
    "expire_dead",
    keys=("active", "active_index", "beats"),
    args=("worker", "dead_ms", "now_ms", "conv"),
)

# A conversation's history (fermix_shared/stores/history.py).
REPLACE_PREFIX = LuaScript(
    "replace_prefix",
    keys=("history",),
    args=("prefix_len", "prefix_last", "checkpoint"),
)

# Scheduled jobs (fermix_shared/scheduling/store.py).
PUT_JOB = LuaScript(
    "put_job",
    keys=("jobs", "due", "runs"),
    args=("name", "expected", "record", "next_run_ms", "run", "runs_cap"),
)

# Channel send rate limits (fermix_shared/channels/ratelimit.py).
RATE_LIMIT = LuaScript(
    "rate_limit",
    keys=("*limits",),
    args=("now_ms", "*intervals_ms"),
)

# Long-term memory (fermix_shared/memory/store.py).
MEMORY_ADD = LuaScript(
    "memory_add",
    keys=("facts", "active", "text_index"),
    args=("fact_id", "fact", "text", "change", "max_active"),
)
MEMORY_UPDATE = LuaScript(
    "memory_update",
    keys=("facts", "active", "archived", "text_index"),
    args=("fact_id", "expected", "fact", "old_text", "new_text", "status", "change",
          "max_archived"),
)
MEMORY_DELETE = LuaScript(
    "memory_delete",
    keys=("facts", "active", "archived", "text_index"),
    args=("fact_id", "text"),
)

# A fan-out's concurrency cap (fermix_worker/subagents/semaphore.py).
FANOUT_SEMAPHORE = LuaScript(
    "fanout_semaphore",
    keys=("slots", "wake"),
    args=("op", "holder", "limit", "lease_ms", "ttl_ms"),
)

# Who runs each subagent, so one whose worker died is re-run (fermix_worker/subagents/claim.py).
SUBAGENT_START = LuaScript(
    "subagent_start",
    keys=("run", "running", "beats"),
    args=("member", "worker", "token", "message", "dead_ms", "ttl_ms", "park_token"),
)
SUBAGENT_PARK = LuaScript(
    "subagent_park",
    keys=("run",),
    args=("token", "park_token", "parked"),
)
SUBAGENT_FINISH = LuaScript(
    "subagent_finish",
    keys=("run",),
    args=("token", "report"),
)
SUBAGENT_COUNTED = LuaScript(
    "subagent_counted",
    keys=("run", "running"),
    args=("member",),
)
SUBAGENT_REQUEUE = LuaScript(
    "subagent_requeue",
    keys=("run", "running", "beats"),
    args=("member", "dead_ms", "again_ms"),
)

# Approvals (fermix_shared/approvals/store.py): a tool call waiting for a person.
APPROVAL_ASK = LuaScript(
    "approval_ask",
    keys=("record", "pending", "by_conv"),
    args=("approval_id", "request", "expires_ms", "conv", "ttl_s"),
)
APPROVAL_DECIDE = LuaScript(
    "approval_decide",
    keys=("record", "pending", "by_conv", "deciding"),
    args=("approval_id", "status", "decided_by", "reason", "now_ms"),
)

# Usage (fermix_shared/usage/store.py): one model call counted in every scope and period.
USAGE_RECORD = LuaScript(
    "usage_record",
    keys=("hour", "day", "month", "unpriced", "reserved", "reservations", "expiry", "rate"),
    args=("input_tokens", "output_tokens", "usd_micros", "unpriced_model", "hour_expire_at",
          "day_expire_at", "month_expire_at", "reservation_id", "now", "count", "cache_read",
          "cache_write", "reasoning", "*scopes"),
)

# Reservations (fermix_shared/usage/reserve.py): a call's worst case held against budgets
# until usage_record settles (or releases) it, fleet-wide; and the agents' tokens per minute.
USAGE_RESERVE = LuaScript(
    "usage_reserve",
    keys=("hour", "day", "month", "budgets", "reserved", "reservations", "expiry", "rate"),
    args=("reservation_id", "usd_micros", "tokens", "expires_at", "hour_bucket", "day_bucket",
          "month_bucket", "rate_agent", "rate_limit", "minute", "*scopes"),
)

# The flight recorder (fermix_shared/recorder/store.py): a run's record, size-capped.
RECORD_APPEND = LuaScript(
    "record_append",
    keys=("record", "size"),
    args=("entry", "max_bytes", "ttl_s", "cut"),
)

# The audit trail (fermix_shared/audit/store.py): one hash chain for the fleet, and its retention.
AUDIT_APPEND = LuaScript(
    "audit_append",
    keys=("head", "entries"),
    args=("body", "digest", "refusal"),
)
AUDIT_TRIM = LuaScript(
    "audit_trim",
    keys=("head", "entries", "anchor"),
    args=("max_entries", "min_ts_ms", "batch"),
)

SCRIPTS: tuple[LuaScript, ...] = tuple(v for v in list(globals().values())
                                       if isinstance(v, LuaScript))
"""Every script declared above."""
