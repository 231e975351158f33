"""Every Redis key Fermix uses, with its TTL. Nothing else builds key names.

All keys share the ``fx:`` prefix. A conversation key string is ``channel|chat_id|scope``.
"""

from __future__ import annotations

PREFIX = "fx"

# Runs (record + event stream) are kept for a week after they are written.
RUN_TTL_SECONDS = 7 * 24 * 3600
# A message id's de-duplication mark outlives any platform's retry window by far.
DEDUPE_TTL_SECONDS = 7 * 24 * 3600
# Worker liveness entries: a worker is "seen" if it wrote within this window.
WORKER_SEEN_TTL_SECONDS = 60
# Cap on a run's event stream (assistant deltas dominate).
RUN_EVENTS_MAXLEN = 10_000


def run(run_id: str) -> str:
    """JSON RunRecord."""
    return f"{PREFIX}:run:{run_id}"


def run_events(run_id: str) -> str:
    """Redis Stream of the run's events (lifecycle, assistant, tool, ...)."""
    return f"{PREFIX}:run:{run_id}:events"


def run_state(run_id: str) -> str:
    """The loop's latest checkpoint (JSON LoopState)."""
    return f"{PREFIX}:run:{run_id}:state"


def inbox(conv: str) -> str:
    """List (FIFO) of JSON InboundMessage waiting for the conversation."""
    return f"{PREFIX}:conv:{conv}:inbox"


def active(conv: str) -> str:
    """Hash ``{turn_id, worker, lease_until, message}``: the conversation's active turn."""
    return f"{PREFIX}:conv:{conv}:active"


def steer(conv: str) -> str:
    """List of JSON InboundMessage to inject into the active turn at its next step (steer mode)."""
    return f"{PREFIX}:conv:{conv}:steer"


def queue_mode(conv: str) -> str:
    """String: this conversation's queue mode, overriding the channel's."""
    return f"{PREFIX}:conv:{conv}:mode"


def active_index() -> str:
    """Sorted set conv -> lease_until (ms): every conversation with an active turn."""
    return f"{PREFIX}:active"


def queued_index() -> str:
    """Sorted set conv -> ms since its inbox head has waited: conversations with pending messages."""
    return f"{PREFIX}:queued"


def reaper_lock() -> str:
    """Held for one reaper interval by the worker that scans for dead turns."""
    return f"{PREFIX}:reaper:lock"


def history(conv: str) -> str:
    """List of JSON history messages (provider-neutral)."""
    return f"{PREFIX}:conv:{conv}:history"


def dedupe(scope: str, message_id: str) -> str:
    """String holding the run id first accepted for ``message_id`` in ``scope``."""
    return f"{PREFIX}:seen:{scope}:{message_id}"


def workers() -> str:
    """Hash worker-name -> last-seen unix time."""
    return f"{PREFIX}:workers"


def rate_limit(name: str) -> str:
    """String: when the next send under this limit may happen (ms since epoch)."""
    return f"{PREFIX}:rl:{name}"


def delivered(delivery_id: str) -> str:
    """Hash chunk-index -> "sent": which chunks of a reply already went out (idempotent sends)."""
    return f"{PREFIX}:delivered:{delivery_id}"
