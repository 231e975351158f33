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


def run_calls(run_id: str) -> str:
    """List of JSON ModelCall: the run's model calls, for its timeline
    (fermix_shared/stores/timeline.py). TTL :data:`RUN_TTL_SECONDS`."""
    return f"{PREFIX}:run:{run_id}:calls"


def run_record(run_id: str) -> str:
    """List of JSON recorder entries: every model request and response and tool result of the
    run, for replay and fork (fermix_shared/recorder/). TTL ``[recorder] keep_days``."""
    return f"{PREFIX}:{{rec:{run_id}}}:entries"


def run_record_size(run_id: str) -> str:
    """String: the bytes :func:`run_record` holds, or ``cut`` once it reached its cap."""
    return f"{PREFIX}:{{rec:{run_id}}}:size"


def recorder_job(job_id: str) -> str:
    """List: the report of one replay or fork a worker ran for the gateway (it waits on it
    with BLPOP). TTL :data:`RECORDER_JOB_TTL_SECONDS`."""
    return f"{PREFIX}:recorder:job:{job_id}"


RECORDER_JOB_TTL_SECONDS = 600


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


def conversations() -> str:
    """Sorted set conv -> when its last message was accepted (ms): every conversation, for the
    console's list (fermix_shared/stores/conversations.py). No TTL."""
    return f"{PREFIX}:conversations"


def conversation_agents() -> str:
    """Hash conv -> the agent its last accepted message was for. No TTL."""
    return f"{PREFIX}:conversations:agents"


def queued_index() -> str:
    """Sorted set conv -> ms since its inbox head has waited: conversations with pending messages."""
    return f"{PREFIX}:queued"


def reaper_lock() -> str:
    """Held for one reaper interval by the worker that scans for dead turns."""
    return f"{PREFIX}:reaper:lock"


def reaper_stale_lock() -> str:
    """Held for one stale-queue interval by the worker that kicks waiting conversations."""
    return f"{PREFIX}:reaper:stale-lock"


def conv_usage(conv: str) -> str:
    """JSON {prompt_tokens, model}: the last turn's provider-reported prompt size."""
    return f"{PREFIX}:conv:{conv}:usage"


def compact_backoff(conv: str) -> str:
    """Set for a while after a failed compaction: no new attempt until it expires."""
    return f"{PREFIX}:conv:{conv}:compact-backoff"


def conv_runs(conv: str) -> str:
    """Sorted set run id -> accepted at (ms): the conversation's newest 50 runs, for the
    console's transcript to link their timelines. No TTL (50 ids a conversation)."""
    return f"{PREFIX}:conv:{conv}:runs"


def history(conv: str) -> str:
    """List of JSON history messages (provider-neutral)."""
    return f"{PREFIX}:conv:{conv}:history"


def session(conv: str) -> str:
    """The conversation's current session id (fermix_shared/stores/sessions.py). No TTL,
    like its history."""
    return f"{PREFIX}:conv:{conv}:session"


def dedupe(scope: str, message_id: str) -> str:
    """String holding the run id first accepted for ``message_id`` in ``scope``."""
    return f"{PREFIX}:seen:{scope}:{message_id}"


def workers() -> str:
    """Hash worker-name -> last-seen unix time."""
    return f"{PREFIX}:workers"


def workers_sandbox() -> str:
    """Hash worker node name -> its SandboxReport JSON (fermix_shared/stores/sandbox.py): how
    it runs commands, written once at its start."""
    return f"{PREFIX}:workers:sandbox"


def worker_slots() -> str:
    """Hash worker process -> its concurrent turns, written at its start (the Fleet view)."""
    return f"{PREFIX}:workers:slots"


def gateways() -> str:
    """Hash gateway (host:port:pid) -> ``{seen, started}`` JSON, every 5 s (the Fleet view)."""
    return f"{PREFIX}:gateways"


def turns_per_minute(minute: int) -> str:
    """Hash outcome -> turns ended in the UTC minute ``minute`` (unix time // 60). TTL 2 h."""
    return f"{PREFIX}:turns:minute:{minute}"


def beat_lock() -> str:
    """RedBeat's leader lock (its default key: ``redbeat_key_prefix`` ``redbeat:`` + ``:lock``)."""
    return "redbeat::lock"


def worker_beats() -> str:
    """Hash worker process (``runtime.worker_name``: node name, pid and a per-start nonce, as
    an active turn's ``worker`` field holds it) -> its last heartbeat, ms of Redis server time;
    ``0`` once it stopped. The reaper drops a silent process's entry once it holds nothing."""
    return f"{PREFIX}:workers:beats"


def rate_limit(name: str) -> str:
    """String: when the next send under this limit may happen (ms since epoch)."""
    return f"{PREFIX}:rl:{name}"


def delivered(delivery_id: str) -> str:
    """Hash chunk-index -> "sent": which chunks of a reply already went out (idempotent sends);
    ``all`` once every one did (fermix_shared/channels/pieces.py)."""
    return f"{PREFIX}:delivered:{delivery_id}"


def delivery_pieces(delivery_id: str) -> str:
    """String (JSON): how the first attempt cut a reply into pieces, while it is delivered
    (fermix_shared/channels/pieces.py)."""
    return f"{PREFIX}:delivery-pieces:{delivery_id}"


# A streamed reply's live message outlives a parked turn (an approval may wait a week).
LIVE_REPLY_TTL_SECONDS = 8 * 24 * 3600


def live_reply(run_id: str) -> str:
    """Hash: the run's live (streamed) reply in its chat: ``mid`` the message being edited and
    ``shown`` its text, ``sent`` the text already sent as blocks, ``final`` once the final
    delivery took the message over (see fermix_worker/turn/live_reply.py)."""
    return f"{PREFIX}:live:{run_id}"


# Long-term memory: global to the agent (one per deployment), never per conversation, so /new
# (which deletes only the conversation's history) keeps it. No TTL: memory persists.
MEMORY_REVIEWED_TTL_SECONDS = 24 * 3600


def memory_facts() -> str:
    """Hash fact-id -> JSON Fact (active and archived)."""
    return f"{PREFIX}:memory:facts"


def memory_active() -> str:
    """Sorted set fact-id -> change number (from ``memory_seq``): the active facts."""
    return f"{PREFIX}:memory:active"


def memory_archived() -> str:
    """Sorted set fact-id -> change number: archived facts, the oldest dropped past a cap."""
    return f"{PREFIX}:memory:archived"


def memory_text_index() -> str:
    """Hash normalized text -> fact-id of the active fact saying it (de-duplication)."""
    return f"{PREFIX}:memory:text"


def memory_seq() -> str:
    """Counter behind fact ids (``m1``, ``m2``, ...) and the order of changes."""
    return f"{PREFIX}:memory:seq"


def memory_vectors(model: str) -> str:
    """Hash SHA-256 of a fact's text -> its embedding by ``model`` (base64 float32), cached
    for recall; fields of texts no active fact says any more are dropped as new ones come."""
    return f"{PREFIX}:memory:vectors:{model}"


def memory_reviewed(run_id: str) -> str:
    """Set once a run's memory review started, so a redelivered task does not review twice."""
    return f"{PREFIX}:memory:reviewed:{run_id}"


def memory_pending(conv: str) -> str:
    """List of JSON ``{run_id, agent, user}``: the conversation's delivered operator turns
    not reviewed yet (one review covers them all, after the conversation went quiet)."""
    return f"{PREFIX}:memory:pending:{conv}"


def memory_review_due() -> str:
    """Sorted set conversation -> when its coalesced review is due (ms): the last turn's end
    plus the quiet period, or now once enough turns are waiting. The reaper starts them."""
    return f"{PREFIX}:memory:review-due"


def memory_reviewing(conv: str) -> str:
    """A review of the conversation's pending turns is running (short TTL)."""
    return f"{PREFIX}:memory:reviewing:{conv}"


# Scheduled jobs. A job's run history keeps this many entries, newest first.
SCHED_RUNS_KEEP = 50
# A scheduled run's own conversation history (one conversation per run) is kept this long
# after the run ends, for post-turn work; the run record and events keep it for RUN_TTL.
SCHED_RUN_HISTORY_TTL_SECONDS = 3600


def sched_jobs() -> str:
    """Hash job name -> JSON Job."""
    return f"{PREFIX}:sched:jobs"


def sched_due() -> str:
    """Sorted set job name -> next run (ms): the jobs that can fire, by when."""
    return f"{PREFIX}:sched:due"


def sched_runs(name: str) -> str:
    """List of JSON JobRun, newest first, capped at SCHED_RUNS_KEEP."""
    return f"{PREFIX}:sched:runs:{name}"


# Subagent fan-outs (the subagents tool as a Celery chord).
def fanout_slots(fanout_id: str) -> str:
    """Sorted set holder -> slot lease expiry (ms): the fan-out's running subagents, its
    fleet-wide concurrency semaphore. Expires with the fan-out's deadline."""
    return f"{PREFIX}:fanout:{fanout_id}:slots"


def fanout_wake(fanout_id: str) -> str:
    """List of wake-up tokens: each released slot pushes one, and a subagent waiting for a slot
    (BLPOP) takes it and tries again at once, not on its next retry. Expires with the slots."""
    return f"{PREFIX}:fanout:{fanout_id}:wake"


def subagent_run(fanout_id: str, index: int) -> str:
    """Hash ``{state, worker, token, message, report, requeued_at, park_token, parked}``: who
    runs one subagent of a fan-out (``running``, ``parked`` for an approval, ``requeued``,
    ``done``), what re-publishing its header task takes, a parked subagent's state, and its
    report once done. Expires with the fan-out."""
    return f"{PREFIX}:fanout:{fanout_id}:sub:{index}"


def subagents_running() -> str:
    """Hash ``fanout_id:index`` -> worker process (or ``requeued``): every subagent being run,
    fleet-wide, for the reaper to re-run the ones whose worker died."""
    return f"{PREFIX}:subagents:running"


def skills_version() -> str:
    """Integer: the skill registry's version. ``fermix skills reload``, ``skill_reload`` and
    ``skill_create`` bump it; every worker compares it at the start of each turn and rescans
    its skill roots when it changed."""
    return f"{PREFIX}:skills:version"


def skills_created() -> str:
    """Hash name -> SKILL.md text: skills written by the ``skill_create`` tool (operator trust),
    kept here so that every host sees them whatever its disk holds."""
    return f"{PREFIX}:skills:created"


# Agent lifecycle (fermix_shared/agents/lifecycle.py): paused agents, the conversations a pause
# holds, when each agent last started or ended a turn, and killed agents. No TTL: they are
# operator state.
def agents_paused() -> str:
    """Hash agent -> when it was paused (ms). A paused agent's messages queue but no new turn
    of it starts; ``fermix agents resume`` deletes the entry."""
    return f"{PREFIX}:agents:paused"


def agents_held() -> str:
    """Hash conversation -> agent: conversations whose inbox head waits for that paused agent
    (written by ``claim``, taken by ``resume``, which dispatches each again)."""
    return f"{PREFIX}:agents:held"


def agents_last_active() -> str:
    """Hash agent -> when a turn of it last started or ended (ms): ``idle`` after a while."""
    return f"{PREFIX}:agents:last-active"


def agents_killed() -> str:
    """Hash agent -> ``{"at": ms, "fingerprint": ...}``: agents killed (``fermix agents
    kill``), for good while they are declared with that definition fingerprint."""
    return f"{PREFIX}:agents:killed"


# Approvals (fermix_shared/approvals/store.py): tool calls waiting for a person.
def approval(approval_id: str) -> str:
    """Hash ``{request, conv, status, decided_by, reason, decided_at}``; kept a week."""
    return f"{PREFIX}:approval:{approval_id}"


def approvals_pending() -> str:
    """Sorted set approval id -> expiry (ms): unanswered requests (the reaper expires them)."""
    return f"{PREFIX}:approvals:pending"


def approvals_by_conv() -> str:
    """Hash conversation -> its pending approval id (what /stop cancels)."""
    return f"{PREFIX}:approvals:by-conv"


def approvals_deciding() -> str:
    """Sorted set approval id -> when answered (ms), until the parked turn took the answer:
    the reaper sends the resume task again for one left too long."""
    return f"{PREFIX}:approvals:deciding"


# Usage and budgets (fermix_shared/usage/). Buckets are UTC hours, days and months; each
# expires its retention after it ends (fermix_shared/usage/periods.py: hours 3 days, days 100
# days, months 2 years). Budgets and the unpriced models have no TTL: operator state.
def usage(period: str, bucket: str) -> str:
    """Hash ``<metric>:<scope>`` -> integer: the model calls of one bucket (``day``,
    ``2025-03-07``) in every scope charged. Metrics: ``in`` and ``out`` (provider-reported
    tokens), ``calls``, ``usd`` (micro-dollars), ``unpriced`` (calls of models without a
    price)."""
    return f"{PREFIX}:usage:{period}:{bucket}"


def usage_unpriced() -> str:
    """Hash model -> calls counted without a price (usage shows them as unpriced)."""
    return f"{PREFIX}:usage:unpriced"


def budgets() -> str:
    """Hash ``<scope>|<period>`` -> JSON Budget: the limits (``fermix budget set``)."""
    return f"{PREFIX}:budgets"


def usage_reserved() -> str:
    """Hash ``<scope>|<period>|<bucket>|usd`` (and ``|tok``) -> what the live reservations of
    model calls hold against that budget's bucket (fermix_shared/usage/reserve.py); a field
    back at 0 is deleted."""
    return f"{PREFIX}:usage:reserved"


def usage_reservations() -> str:
    """Hash reservation id -> JSON ``{u, t, f}``: one model call's worst case (micro-dollars,
    tokens) and the reserved fields it holds, until the call settles or lapses."""
    return f"{PREFIX}:usage:reservations"


def usage_reservation_expiry() -> str:
    """Sorted set reservation id -> when it lapses (unix time): a caller that died before
    settling leaves nothing reserved past it."""
    return f"{PREFIX}:usage:reservations:expiry"


def usage_rate() -> str:
    """Hash agent -> ``<minute>:<tokens>``: its calls' tokens in that UTC minute (the
    token-rate breaker, fermix_shared/usage/rate.py); one field per agent, overwritten."""
    return f"{PREFIX}:usage:rate"


def budget_warned(period: str, bucket: str) -> str:
    """Hash scope -> when its warning was sent (ms): a budget warns once per scope and
    bucket. Expires with the bucket."""
    return f"{PREFIX}:budgets:warned:{period}:{bucket}"


# Named API tokens (fermix_shared/access/tokens.py), both keys under the hash tag ``{tokens}``
# so the transaction that changes them stays possible under a Redis Cluster. No TTL.
def api_tokens() -> str:
    """Hash SHA-256 of a token's secret -> the token's JSON (name, role, created, hint)."""
    return f"{PREFIX}:{{tokens}}:by_hash"


def api_token_names() -> str:
    """Hash token name -> the SHA-256 of its secret."""
    return f"{PREFIX}:{{tokens}}:by_name"


def console_session(sid_sha: str) -> str:
    """A console session's JSON (fermix_shared/access/sessions.py), by the SHA-256 of its id;
    expires with the session."""
    return f"{PREFIX}:{{tokens}}:session:{sid_sha}"


# The audit trail (fermix_shared/audit/): one hash-chained log for the whole fleet. Every key
# carries the hash tag ``{audit}``, so under a Redis Cluster they share one slot and the
# append and trim scripts, which touch several of them, stay possible. No TTL: retention is
# ``[audit] max_entries`` / ``max_age_days``, applied by the reaper (it moves the anchor).
def audit_head() -> str:
    """Hash ``{seq, hash, ts}`` of the newest entry: what the next append links to."""
    return f"{PREFIX}:{{audit}}:head"


def audit_entries() -> str:
    """Hash seq -> entry JSON (``fermix_shared/audit/model.py`` says what an entry holds)."""
    return f"{PREFIX}:{{audit}}:entries"


def audit_anchor() -> str:
    """Hash ``{seq, hash, ts}`` of the last entry retention dropped: the chain verifies from
    it (absent: from seq 0 and 64 zeros)."""
    return f"{PREFIX}:{{audit}}:anchor"


def audit_refusals(window_start_s: int) -> str:
    """Hash sender -> refusals in the window starting at ``window_start_s`` (epoch seconds),
    plus ``#senders`` and ``#others``: strangers' refusals counted, not each appended
    (fermix_shared/audit/refusals.py). TTL :data:`AUDIT_REFUSALS_TTL_SECONDS`."""
    return f"{PREFIX}:{{audit}}:refusals:{window_start_s}"


AUDIT_REFUSALS_TTL_SECONDS = 2 * 3600
