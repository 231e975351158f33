"""The reaper: finds work whose worker died, and conversations nobody is dispatching.

Every worker process writes a heartbeat (:class:`~fermix_worker.fleet.heartbeat.Heartbeat`, one Lua call in Redis server
time) every ``worker_heartbeat_seconds``. The reaper runs on a timer in every worker (so
recovery needs no special process); a short Redis lock lets one worker per interval scan:

- a turn whose worker process has been silent for the dead threshold is treated as if its
  lease had lapsed (``expire_dead``: the change and its checks are one step), so it resumes
  seconds after the process died rather than when its lease runs out. A parked turn (waiting
  on a fan-out) has no worker and is left to its deadline; a live but slow worker keeps its
  turns for the margin the threshold gives (several missed beats);
- every turn whose lease lapsed is *recovered in this process* (:class:`Recoveries`): its
  dispatch runs beside the Celery pool, not as a task behind a saturated worker's slots;
- a subagent whose worker died is handed to ``republish``, which sends its header task again
  under the same task id (see :mod:`fermix_worker.subagents.claim`);
- less often, conversations whose messages waited longer than a lease with no turn active
  get a Celery dispatch kicked; not those held for a paused agent (resuming it dispatches
  them), so a long pause costs the scan one hash read, not a dispatch per conversation.

It only starts dispatches: the atomic claim decides what happens (an expired lease is resumed
or closed as an orphan; a free conversation runs its next message), so a recovery too many is
harmless. A process that could not itself reach Redis steadily for the whole dead threshold
declares nobody dead: after a Redis outage every heartbeat is old.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from fermix_shared import keys, lua, metrics
from fermix_shared.settings import Settings
from fermix_shared.stores.lease import now_ms
from fermix_worker.fleet.heartbeat import Liveness
from fermix_worker.fleet.sweeper import Sweep, run_sweeps

log = logging.getLogger(__name__)

# Conversations looked at per scan and per kind; the rest wait for the next scan.
SCAN_LIMIT = 500
# Active turns whose holder is read per round trip while a dead worker is being looked for.
HOLDER_BATCH = 1000


class Recoveries:
    """Runs recovered turns' dispatches in this process, each in its own thread (a greenlet
    under gevent), beside the Celery pool: a recovery must not wait for a free slot on a
    saturated worker. At most ``limit`` at once; past that, ``kick`` (a Celery dispatch)."""

    def __init__(self, dispatch: Callable[[str], object], kick: Callable[[str], None],
                 limit: int):
        self._dispatch, self._kick, self._limit = dispatch, kick, max(1, limit)
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._idle = threading.Condition(self._lock)

    def __call__(self, conv: str) -> None:
        with self._lock:
            if conv in self._running:
                return
            if len(self._running) >= self._limit:
                self._kick(conv)
                return
            self._running.add(conv)
        threading.Thread(target=self._run, args=(conv,), name="fermix-recovery",
                         daemon=True).start()

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def drain(self, timeout_s: float) -> bool:
        """Wait for the recoveries in flight (worker shutdown); False if some outlived it."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout_s)

    def _run(self, conv: str) -> None:
        try:
            self._dispatch(conv)
        except Exception:
            log.exception("recovery of %s failed", conv)
        finally:
            with self._idle:
                self._running.discard(conv)
                self._idle.notify_all()


@dataclass
class Reaped:
    """What one scan did (for logs and tests)."""

    recovered: list[str] = field(default_factory=list)
    dead_workers: list[str] = field(default_factory=list)
    rerun_subagents: list[str] = field(default_factory=list)
    kicked: list[str] = field(default_factory=list)
    # What each registered sweep acted on, by its name (fleet/sweeper.py).
    swept: dict[str, int] = field(default_factory=dict)


def _server_ms(r: redis.Redis) -> int:
    secs, micros = r.time()
    return int(secs) * 1000 + int(micros) // 1000


@dataclass(frozen=True)
class Beats:
    """The heartbeat hash at one moment: every worker process that beats, and the silent."""

    known: frozenset[str]
    dead: frozenset[str]


def read_beats(r: redis.Redis, dead_ms: int) -> Beats:
    """Worker processes whose last heartbeat is at least ``dead_ms`` old (Redis server time)
    are ``dead``."""
    beats: Any = r.hgetall(keys.worker_beats())
    if not beats:
        return Beats(frozenset(), frozenset())
    now = _server_ms(r)
    dead = []
    for name, value in beats.items():
        try:
            if now - int(float(value)) >= dead_ms:
                dead.append(str(name))
        except ValueError:
            continue
    return Beats(frozenset(str(n) for n in beats), frozenset(dead))


def _holders(r: redis.Redis, convs: list[str]) -> list[str | None]:
    out: list[str | None] = []
    for i in range(0, len(convs), HOLDER_BATCH):
        pipe = r.pipeline(transaction=False)
        for conv in convs[i:i + HOLDER_BATCH]:
            pipe.hget(keys.active(conv), "worker")
        out.extend(pipe.execute())
    return out


def expire_dead_turns(
    r: redis.Redis, dead: Iterable[str], dead_ms: int
) -> tuple[list[str], set[str]]:
    """End the leases of turns held by ``dead`` workers; returns those conversations and the
    dead workers that still held a live lease."""
    dead = set(dead)
    now = now_ms()
    live: Any = r.zrangebyscore(keys.active_index(), now + 1, "+inf")
    convs = [str(c) for c in live]
    expired, holding = [], set()
    for conv, worker in zip(convs, _holders(r, convs), strict=True):
        if worker not in dead:
            continue
        holding.add(str(worker))
        if lua.EXPIRE_DEAD(r, active=keys.active(conv), active_index=keys.active_index(),
                           beats=keys.worker_beats(), worker=worker, dead_ms=dead_ms,
                           now_ms=now, conv=conv):
            expired.append(conv)
    return expired, holding


def rerun_dead_subagents(
    r: redis.Redis, republish: Callable[[str], None], beats: Beats, dead_ms: int, again_ms: int
) -> tuple[list[str], set[str]]:
    """Hand every subagent whose worker died (or whose re-run nobody started for
    ``again_ms``) to ``republish``; returns them and the workers still holding subagents."""
    running: Any = r.hgetall(keys.subagents_running())
    holders = {str(w) for w in running.values()}
    out = []
    for name, worker in running.items():
        # A live worker's subagents are left alone (one Lua call each for the rest: the dead,
        # the re-published, and a worker that does not beat, whose fan-out may have expired).
        if worker in beats.known and worker not in beats.dead:
            continue
        fanout_id, _, index = str(name).rpartition(":")
        message = lua.SUBAGENT_REQUEUE(
            r, run=keys.subagent_run(fanout_id, int(index)), running=keys.subagents_running(),
            beats=keys.worker_beats(), member=name, dead_ms=dead_ms, again_ms=again_ms)
        if message:
            try:
                republish(str(message))
            except Exception:  # published again after again_ms
                log.warning("re-running subagent %s failed", name, exc_info=True)
            out.append(str(name))
    return out, holders


def forget(r: redis.Redis, workers: Iterable[str]) -> None:
    """Drop dead workers that hold nothing any more from the heartbeat hash."""
    names = list(workers)
    if names:
        r.hdel(keys.worker_beats(), *names)


def stale_conversations(r: redis.Redis, stale_s: float) -> list[str]:
    """Conversations whose inbox head waited longer than ``stale_s`` with no turn active and
    that no pause holds."""
    stale: Any = r.zrangebyscore(keys.queued_index(), "-inf", now_ms() - int(stale_s * 1000),
                                 start=0, num=SCAN_LIMIT)
    if not stale:
        return []
    pipe = r.pipeline(transaction=False)
    pipe.hkeys(keys.agents_paused())
    pipe.hmget(keys.agents_held(), stale)
    for conv in stale:
        pipe.zscore(keys.active_index(), conv)
    paused_raw, held, *scores = pipe.execute()
    paused = set(paused_raw)
    # A conversation with a live turn gets its next dispatch when that turn finishes; one held
    # for a paused agent, when the agent resumes (kicking it would only be held again). An
    # entry whose agent is no longer paused is stale and does not hold it back.
    return [str(c) for c, agent, score in zip(stale, held, scores, strict=True)
            if score is None and agent not in paused]


@dataclass(frozen=True)
class ReaperConfig:
    """The reaper's timings: scan every ``liveness.heartbeat_s``; stale conversations (waiting
    longer than ``stale_s``) are looked for every ``stale_every_s``; a re-run subagent nobody
    started is published again after ``rerun_again_s``."""

    liveness: Liveness
    stale_s: float
    stale_every_s: float
    rerun_again_s: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ReaperConfig:
        lease = settings.lease_seconds
        return cls(Liveness.from_settings(settings), stale_s=lease,
                   stale_every_s=max(1.0, lease / 3), rerun_again_s=max(60.0, 2 * lease))


def reap(
    r: redis.Redis,
    config: ReaperConfig,
    *,
    recover: Callable[[str], None],
    kick: Callable[[str], None],
    republish: Callable[[str], None],
    may_declare_dead: bool = True,
    sweeps: Sequence[Sweep] = (),
) -> Reaped:
    """One scan (nothing if another worker holds the lock for this interval): dead workers'
    turns and subagents, then the features' ``sweeps``, then lapsed and stale conversations."""
    out = Reaped()
    interval_ms = int(config.liveness.heartbeat_s * 1000)
    if not r.set(keys.reaper_lock(), "1", nx=True, px=max(1, int(interval_ms * 0.9))):
        return out
    dead_ms = config.liveness.dead_ms
    if may_declare_dead:
        beats = read_beats(r, dead_ms)
        dead = sorted(beats.dead)
        holding: set[str] = set()
        if dead:
            expired, holding = expire_dead_turns(r, dead, dead_ms)
            if expired:
                log.warning("worker(s) %s stopped beating; resuming %d turn(s): %s",
                            dead, len(expired), expired[:10])
            out.dead_workers = dead
        rerun, sub_holders = rerun_dead_subagents(r, republish, beats, dead_ms,
                                                  int(config.rerun_again_s * 1000))
        if rerun:
            log.warning("re-running %d subagent(s) whose worker died: %s", len(rerun), rerun[:10])
        out.rerun_subagents = rerun
        forget(r, beats.dead - holding - sub_holders)
    out.swept = run_sweeps(sweeps)
    lapsed: Any = r.zrangebyscore(keys.active_index(), "-inf", now_ms(), start=0, num=SCAN_LIMIT)
    out.recovered = [str(c) for c in lapsed]
    for conv in out.recovered:
        recover(conv)
    every_ms = max(1, int(config.stale_every_s * 1000 * 0.9))
    if r.set(keys.reaper_stale_lock(), "1", nx=True, px=every_ms):
        out.kicked = stale_conversations(r, config.stale_s)
        if out.kicked:
            metrics.count_reaper_recovery("stale_kicked", len(out.kicked))
        for conv in out.kicked:
            kick(conv)
    if out.recovered or out.kicked:
        log.info("reaper recovered %d and kicked %d conversation(s): %s",
                 len(out.recovered), len(out.kicked), [*out.recovered, *out.kicked][:10])
    return out


class Reaper:
    """Runs ``scan`` every ``interval_s`` in a background thread (a greenlet under gevent)."""

    def __init__(self, scan: Callable[[], object], interval_s: float):
        self._scan, self._interval = scan, interval_s
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="fermix-reaper", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._scan()
            except Exception:
                log.warning("reaper scan failed", exc_info=True)
