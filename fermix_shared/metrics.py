"""Prometheus metrics: what operators graph and alert on. One line at every call site.

Metrics (the client adds ``_total`` to counters; histograms add ``_bucket``/``_sum``/``_count``):

* ``fermix_turns_total{status}``: turns ended, ``ok`` / ``error`` / ``stopped``.
* ``fermix_iterations_total``: model calls made by agent loops.
* ``fermix_provider_latency_seconds{provider,model}``: one model call (each attempt through
  the route chain: a retried or failed-over call is several), success or failure.
* ``fermix_tool_latency_seconds{tool}`` and ``fermix_tool_calls_total{tool,outcome}``.
* ``fermix_failovers_total{from_provider,to_provider}``: a turn moved to another provider.
* ``fermix_retries_total{provider,kind}``: ``transient`` error retried, or a ``continuation``
  call for a reply cut short.
* ``fermix_runs_accepted_total{channel}``: messages the gateway accepted (gateway process).
* ``fermix_reaper_recoveries_total{outcome}``: a dead worker's turn ``resumed`` from its
  checkpoint or ``orphan_closed`` (given up), or ``stale_kicked`` (a queued conversation
  nobody dispatched was kicked).
* ``fermix_audit_write_failures_total{kind}``: audit entries that could not be written (the
  action went ahead: auditing fails open, see fermix_shared/audit/emit.py).
* ``fermix_unreplicated_accepts_total`` (gateway) and ``fermix_unreplicated_deliveries_total``
  (worker): messages accepted, and reply sends begun, while the Redis primary had no
  connected replica under ``FERMIX_REDIS_WAIT_REPLICAS=auto`` (fermix_shared/redis/replicas.py):
  writes a loss of that primary would lose.

Fleet-wide gauges, read from Redis when the gateway's ``/metrics`` is scraped (every gateway
reports the same values: aggregate them with ``max()``, not ``sum()``):

* ``fermix_dispatch_queue_length``: dispatch tasks waiting in the broker for a free worker
  slot (a worker reserves only as many tasks as it has free slots, prefetch multiplier 1, so
  this grows only when every slot is busy): the signal to add workers (``deploy/kubernetes/worker.yaml`` scales on it).
* ``fermix_active_turns``: conversations with a turn running now, fleet-wide.
* ``fermix_conversations_waiting``: conversations with messages waiting for their turn
  (behind their own running turn, or for a worker).

Metrics live in the process that records them. The gateway serves its own on ``GET /metrics``
(a gateway of several processes, ``fermix gateway --processes N``, runs prometheus-client's
multiprocess mode: every process writes to files in ``PROMETHEUS_MULTIPROC_DIR`` and the one
answering the scrape reports their sum);
a worker process serves its own on ``Settings.metrics_port`` (:func:`start_metrics_server`):
one port per worker process, so several workers on one host need several ports. Neither
endpoint has auth: keep them on loopback or behind a firewall, never on the public internet.

Label values must come from closed sets: pass a tool's registered name, or ``"unknown"`` for a
name the model made up (every distinct label value is a new time series, kept forever).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from redis.exceptions import RedisError

from fermix_shared.models import RunStatus
from fermix_shared.task_names import QUEUE

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)

TurnStatus = Literal["ok", "error", "stopped"]
ToolOutcome = Literal["ok", "error"]
RetryKind = Literal["transient", "continuation"]
ReaperOutcome = Literal["resumed", "orphan_closed", "stale_kicked"]

# Model calls: a cached short answer takes ~0.3 s, a long streamed one a minute or two.
PROVIDER_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 90, 120)
# Tools: local ones take milliseconds, network ones seconds.
TOOL_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# The gateway's answers: most in milliseconds, a /wait or an SSE stream up to a minute or more.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

TURNS = Counter("fermix_turns", "Turns ended, by status.", ["status"])
TOKENS = Counter(
    "fermix_tokens",
    "Tokens model calls used, by agent, model and kind: input and output as billed (input "
    "includes the cache's reads and writes, output the reasoning), and those parts apart.",
    ["agent", "model", "kind"],
)
COST = Counter("fermix_cost_usd", "US dollars priced model calls cost, by agent and model.",
               ["agent", "model"])
HTTP_LATENCY = Histogram(
    "fermix_http_request_seconds",
    "Seconds the gateway took to answer a request (to the end of its body), by route template.",
    ["method", "route", "status"], buckets=HTTP_BUCKETS,
)
ITERATIONS = Counter("fermix_iterations", "Model calls made by agent loops.")
PROVIDER_LATENCY = Histogram(
    "fermix_provider_latency_seconds", "Seconds one model call took.",
    ["provider", "model"], buckets=PROVIDER_BUCKETS,
)
TOOL_LATENCY = Histogram(
    "fermix_tool_latency_seconds", "Seconds one tool call took.", ["tool"], buckets=TOOL_BUCKETS
)
TOOL_CALLS = Counter("fermix_tool_calls", "Tool calls, by outcome.", ["tool", "outcome"])
FAILOVERS = Counter(
    "fermix_failovers", "Turns moved to another provider.", ["from_provider", "to_provider"]
)
RETRIES = Counter("fermix_retries", "Provider calls made again.", ["provider", "kind"])
RUNS_ACCEPTED = Counter("fermix_runs_accepted", "Messages accepted by the gateway.", ["channel"])
REAPER_RECOVERIES = Counter(
    "fermix_reaper_recoveries", "Turns and conversations recovered.", ["outcome"]
)
AUDIT_WRITE_FAILURES = Counter(
    "fermix_audit_write_failures", "Audit entries that could not be written.", ["kind"]
)
UNREPLICATED_ACCEPTS = Counter(
    "fermix_unreplicated_accepts", "Messages accepted while the Redis primary had no replica."
)
UNREPLICATED_DELIVERIES = Counter(
    "fermix_unreplicated_deliveries", "Reply sends begun while the Redis primary had no replica."
)

_TURN_STATUSES: tuple[str, ...] = get_args(TurnStatus)
# Closed label sets start at zero, so rate() and absence alerts work before the first event.
for _status in _TURN_STATUSES:
    TURNS.labels(status=_status)
for _outcome in get_args(ReaperOutcome):
    REAPER_RECOVERIES.labels(outcome=_outcome)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Distinct ``model`` label values of the provider histogram one process keeps.
MAX_MODEL_LABELS = 32
_model_labels: set[str] = set()


def count_turn(status: TurnStatus | RunStatus) -> None:
    """A turn ended; a non-terminal status is a caller's bug, logged and not counted."""
    if status not in _TURN_STATUSES:
        log.warning("count_turn(%r): not a terminal status; not counted", status)
        return
    TURNS.labels(status=str(status)).inc()


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """One answered request: ``route`` is the matched route's template (``/v1/runs/{run_id}``,
    ``unmatched`` for none, so paths never become labels), ``status`` counted by class."""
    HTTP_LATENCY.labels(method, route, f"{status // 100}xx").observe(seconds)


def count_usage(agent: str, model: str, usd_micros: int, **tokens: int) -> None:
    """One answered model call's tokens (``input``, ``output``, ``cache_read``, ``cache_write``,
    ``reasoning``; zeros left out) and cost, for its agent (``-`` when unattributed) and the
    model it was priced by."""
    agent = agent or "-"
    for kind, n in tokens.items():
        if n:
            TOKENS.labels(agent, model, kind).inc(n)
    if usd_micros:
        COST.labels(agent, model).inc(usd_micros / 1e6)


def count_iteration() -> None:
    ITERATIONS.inc()


def observe_provider_call(provider: str, model: str, seconds: float) -> None:
    """One model call (RoutedProvider times each attempt). ``model`` is free text (a
    subagents call may name any model), so past :data:`MAX_MODEL_LABELS` distinct models in
    this process the rest share ``model="other"``."""
    if model not in _model_labels:
        if len(_model_labels) >= MAX_MODEL_LABELS:
            model = "other"
        else:
            _model_labels.add(model)
    PROVIDER_LATENCY.labels(provider=provider, model=model).observe(seconds)


@contextmanager
def time_provider_call(provider: str, model: str) -> Iterator[None]:
    """Time the block as one model call, whether it returns or raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        observe_provider_call(provider, model, time.perf_counter() - start)


def observe_tool_call(tool: str, seconds: float, outcome: ToolOutcome) -> None:
    TOOL_LATENCY.labels(tool=tool).observe(seconds)
    TOOL_CALLS.labels(tool=tool, outcome=outcome).inc()


@dataclass
class ToolTiming:
    """What :func:`time_tool` yields: set ``outcome`` when the block's result is an error."""

    outcome: ToolOutcome = "ok"


@contextmanager
def time_tool(tool: str) -> Iterator[ToolTiming]:
    """Time the block as one call of ``tool``; ``error`` if it raises or sets it so."""
    timing = ToolTiming()
    start = time.perf_counter()
    try:
        yield timing
    except BaseException:
        timing.outcome = "error"
        raise
    finally:
        observe_tool_call(tool, time.perf_counter() - start, timing.outcome)


def count_failover(from_provider: str, to_provider: str) -> None:
    FAILOVERS.labels(from_provider=from_provider, to_provider=to_provider).inc()


def count_retry(provider: str, kind: RetryKind) -> None:
    RETRIES.labels(provider=provider, kind=kind).inc()


def count_run_accepted(channel: str) -> None:
    RUNS_ACCEPTED.labels(channel=channel).inc()


def count_reaper_recovery(outcome: ReaperOutcome, n: int = 1) -> None:
    REAPER_RECOVERIES.labels(outcome=outcome).inc(n)


def count_audit_failure(kind: str) -> None:
    AUDIT_WRITE_FAILURES.labels(kind=kind).inc()


def count_unreplicated(step: Literal["accept", "delivery"]) -> None:
    """A write that went ahead without a replica (``FERMIX_REDIS_WAIT_REPLICAS=auto``)."""
    (UNREPLICATED_ACCEPTS if step == "accept" else UNREPLICATED_DELIVERIES).inc()


# Set (to an empty directory) before prometheus-client is imported: multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def render() -> bytes:
    """The process's metrics in the Prometheus text format (serve with :data:`CONTENT_TYPE`);
    in multiprocess mode, the sum over every process writing to the shared directory."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest()


FLEET_GAUGES = (
    ("fermix_dispatch_queue_length", "Dispatch tasks waiting in the broker for a worker slot."),
    ("fermix_active_turns", "Conversations with a turn running, fleet-wide."),
    ("fermix_conversations_waiting", "Conversations with messages waiting for their turn."),
)


async def render_fleet(r: aioredis.Redis) -> bytes:
    """The fleet-wide gauges (module docstring), read from Redis now, in the text format;
    nothing when Redis cannot be reached (the scrape still gets the process's own metrics)."""
    from fermix_shared import keys

    pipe = r.pipeline(transaction=False)
    pipe.llen(QUEUE)
    pipe.zcard(keys.active_index())
    pipe.zcard(keys.queued_index())
    try:
        values = await pipe.execute()
    except RedisError as e:  # the process's own metrics still answer; these are left out
        log.warning("fleet gauges left out of /metrics: redis unavailable: %s", e)
        return b""
    lines = []
    for (name, help_text), v in zip(FLEET_GAUGES, values, strict=True):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {int(v)}"]
    return ("\n".join(lines) + "\n").encode()


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> bool:
    """Serve :func:`render` on ``addr:port`` from a background thread; False if the port is
    taken (logged: metrics are not worth failing a worker for)."""
    try:
        start_http_server(port, addr=addr)
    except OSError as e:
        log.error("metrics server on %s:%d not started: %s", addr, port, e)
        return False
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return True
