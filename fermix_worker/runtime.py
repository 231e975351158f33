"""The worker process, wired in one place: :class:`Runtime` owns every collaborator a task
needs and the process's background work; :mod:`fermix_worker.bootstep` starts and stops it.

A task shell (:mod:`fermix_worker.tasks`) asks :meth:`Runtime.current` for what it runs on.
The collaborators are built on first use under a lock (many greenlets start at once), so a
process that runs one turn without a Celery worker (``fermix agent --local``) builds only what
that turn needs. :meth:`Runtime.start` (the bootstep, before the worker consumes) builds them
all at once, so the first turn does not pay for SDK imports, and starts the heartbeat and the
reaper; :meth:`shutting_down` and :meth:`shutdown` are the graceful stop
(:mod:`fermix_worker.fleet.shutdown`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import ClassVar, TypeVar, cast

import redis
from celery import Celery

from fermix_shared import audit, metrics
from fermix_shared.celery_app import app as celery_app
from fermix_shared.channels.registry import outbound
from fermix_shared.errors import ConfigError
from fermix_shared.hooks import get_hooks
from fermix_shared.memory import MemoryStore
from fermix_shared.memory.reviews import start_due_reviews
from fermix_shared.redis.client import get_redis
from fermix_shared.settings import Settings, get_settings
from fermix_shared.skills import SkillRegistry
from fermix_shared.task_names import APPROVAL_RESUME_TASK, DISPATCH_TASK, REVIEW_CONVERSATION_TASK
from fermix_worker.approvals.policy import settle_approvals
from fermix_worker.compaction.conversation import ConversationCompactor
from fermix_worker.compaction.listener import ScheduleCompaction
from fermix_worker.fleet.counts import CountTurns
from fermix_worker.fleet.heartbeat import Heartbeat
from fermix_worker.fleet.reaper import Reaper, ReaperConfig, Recoveries, reap
from fermix_worker.fleet.shutdown import GracefulStop, release_held
from fermix_worker.fleet.sweeper import Sweep
from fermix_worker.mcp.tools import LiveTools, with_mcp_tools
from fermix_worker.memory.reviewer import MemoryReviewer, QueueReview
from fermix_worker.providers import build_router
from fermix_worker.providers.routing import Router
from fermix_worker.scheduling.ticker import RecordJobRun
from fermix_worker.subagents.claim import republish
from fermix_worker.subagents.fanout import CeleryFanOut
from fermix_worker.subagents.runner import SubagentRunner
from fermix_worker.subagents.skill_tool import SKILL_RUN_TOOL
from fermix_worker.subagents.tool import SUBAGENTS_TOOL
from fermix_worker.tools import BUILTIN_TOOLS
from fermix_worker.tools.base import Tool, ToolRegistry
from fermix_worker.tools.command import command_tools, sandbox_report
from fermix_worker.tools.files import file_tools
from fermix_worker.tools.memory import memory_tools
from fermix_worker.tools.messaging import messaging_tools
from fermix_worker.tools.schedule import schedule_tools
from fermix_worker.tools.skills import skill_tools
from fermix_worker.turn import TurnRunner
from fermix_worker.turn.dispatch import Dispatcher
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.turn.wiring import TurnWiring
from fermix_worker.usage.alerts import BudgetAlerts
from fermix_worker.usage.budgets import WarnOnBudget
from fermix_worker.usage.meter import UsageMeter
from fermix_worker.usage.metered import metered

log = logging.getLogger(__name__)

# Told apart from an earlier process of the same node and pid (a restarted container's worker
# is pid 1 again): a heartbeat must never vouch for a dead process's turns.
_INSTANCE = uuid.uuid4().hex[:6]
_T = TypeVar("_T")


def worker_name(hostname: str | None) -> str:
    """Unique per process: Celery's node name, pid and a per-start nonce. Turns record it as
    their holder and the process's heartbeat is written under it (the reaper matches the two)."""
    return f"{hostname or socket.gethostname()}:{os.getpid()}:{_INSTANCE}"


class Runtime:
    """One worker process's collaborators and background work (module docstring)."""

    _current: ClassVar[Runtime | None] = None
    _installing: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: Settings, r: redis.Redis, app: Celery, node: str | None = None):
        self.settings, self.redis, self.app = settings, r, app
        self.node = node or "worker"
        self.name = worker_name(self.node)
        self._lock = threading.RLock()
        self._built: dict[str, object] = {}
        self._heartbeat: Heartbeat | None = None
        self._reaper: Reaper | None = None
        self._recoveries: Recoveries | None = None
        self.stopping: GracefulStop | None = None

    # -- the one instance of the process ------------------------------------------------------

    @classmethod
    def install(cls, runtime: Runtime) -> Runtime:
        """Make ``runtime`` the process's (the bootstep does, before the worker consumes)."""
        cls._current = runtime
        return runtime

    @classmethod
    def current(cls) -> Runtime:
        """The process's runtime: the bootstep's, else one built from the settings (a process
        without a Celery worker: ``fermix agent --local``, a test calling a task)."""
        if cls._current is None:
            with cls._installing:
                if cls._current is None:
                    cls._current = cls(get_settings(), get_redis(), celery_app)
        return cls._current

    # -- collaborators, built on first use ------------------------------------------------------

    def router(self) -> Router:
        """The process's provider router, metered (raises ConfigError until the provider is
        usable)."""
        # Built once per process, like every collaborator here: nothing is kept when the
        # provider is not usable yet (ConfigError), so the next turn tries again.
        return self._once("router", lambda: metered(build_router(self.settings), self.meter))

    @property
    def meter(self) -> UsageMeter | None:
        """Counts every model call this process makes (usage/meter.py); None with usage off."""
        return self._once("meter", lambda: UsageMeter.from_settings(
            self.redis, self.settings, on_cap=self.budget_alerts.cap)
            if self.settings.usage.enabled else None)

    @property
    def budget_alerts(self) -> BudgetAlerts:
        """The owners' alerts at a budget's warning and cap (usage/alerts.py)."""
        return self._once("budget_alerts", lambda: BudgetAlerts(
            self.redis, self.settings,
            lambda task, args: self.app.send_task(task, args=args, ignore_result=True)))

    def _once(self, name: str, build: Callable[[], _T]) -> _T:
        """The collaborator ``name``, built by the first caller (the others wait for it)."""
        if name not in self._built:
            with self._lock:
                if name not in self._built:
                    self._built[name] = build()
        return cast(_T, self._built[name])

    @property
    def skills(self) -> SkillRegistry:
        return self._once("skills", lambda: SkillRegistry(self.redis, self.settings.home))

    @property
    def turn_runner(self) -> TurnRunner:
        return self._once("turn_runner", self._build_turn_runner)

    def _build_turn_runner(self) -> TurnRunner:
        settings, r = self.settings, self.redis
        listeners = TurnListeners([
            RecordJobRun(r),
            CountTurns(r),
            WarnOnBudget(r, settings, outbound, alerts=self.budget_alerts),
            QueueReview(r, settings),
            ScheduleCompaction(r, ConversationCompactor(r, settings, self.router),
                               self.kick),
        ])
        return TurnRunner.wired(TurnWiring(
            r, settings, self.turn_tools,
            router=self.router, channels=outbound, hooks=get_hooks(),
            fanout=CeleryFanOut(self.app, settings, lambda: self.skills),
            listeners=listeners, skills=self.skills,
        ))

    @property
    def turn_tools(self) -> ToolRegistry:
        """Every tool a turn of this process may be offered (built-ins and MCP servers'),
        before a turn's scope narrows them."""
        return self._once("turn_tools", lambda: with_mcp_tools(
            self.settings.mcp_servers, self._turn_tools(),
            timeout_s=self.settings.tool_timeout_seconds))

    def _turn_tools(self) -> list[Tool]:
        settings = self.settings
        return [
            *BUILTIN_TOOLS,
            *schedule_tools(lambda: self.redis, self.kick, settings.turn_timeout),
            SUBAGENTS_TOOL,
            *memory_tools(lambda: MemoryStore(self.redis)),
            *skill_tools(lambda: self.skills),
            SKILL_RUN_TOOL,
            # Only when a workspace is configured (settings or an agent).
            *file_tools(settings),
            *command_tools(settings),
            # Replies by other means than the final text (a reaction, a message or a file).
            *messaging_tools(outbound, settings),
        ]

    @property
    def subagent_runner(self) -> SubagentRunner:
        return self._once("subagent_runner", self._build_subagent_runner)

    def _build_subagent_runner(self) -> SubagentRunner:
        # The MCP tools known when each job starts (a server that came up later is offered
        # from then on), the skill, file and command tools (the workspace read-only, their
        # skill_run inline), minus what subagents never get (SubagentTools).
        settings = self.settings
        own = [*BUILTIN_TOOLS, *skill_tools(lambda: self.skills), SKILL_RUN_TOOL,
               *file_tools(settings), *command_tools(settings, warn=False)]
        return SubagentRunner(self.redis, settings, LiveTools(own, settings.mcp_servers),
                              get_hooks(), meter=self.meter, skills=lambda: self.skills,
                              channels=outbound)

    @property
    def memory_reviewer(self) -> MemoryReviewer:
        return self._once("memory_reviewer", lambda: MemoryReviewer(self.redis, self.router))

    def dispatcher(self, worker: str) -> Dispatcher:
        return Dispatcher(self.redis, self.settings, self.turn_runner, worker, self.kick)

    def kick(self, conv: str) -> None:
        """Enqueue a dispatch for ``conv`` (any worker runs it)."""
        self.app.send_task(DISPATCH_TASK, args=[conv], ignore_result=True)

    def sweeps(self) -> list[Sweep]:
        """The features' housekeeping, run by the reaper's scan (fleet/sweeper.py)."""
        r, send = self.redis, self.app.send_task
        return [
            Sweep("approvals", lambda: len(settle_approvals(r, lambda approval_id: send(
                APPROVAL_RESUME_TASK, args=[approval_id], ignore_result=True)))),
            Sweep("memory_reviews", lambda: len(start_due_reviews(r, lambda conv: send(
                REVIEW_CONVERSATION_TASK, args=[conv], ignore_result=True)))),
            Sweep("audit", lambda: audit.apply_retention(r, self.settings.audit)),
        ]

    # -- the process's background work -------------------------------------------------------

    def start(self) -> None:
        """Build the collaborators, then start the heartbeat (``fermix status`` lists workers
        seen; the reaper takes a silent process for dead) and the reaper's timer."""
        self._warm_up()
        settings, r = self.settings, self.redis
        if settings.metrics_port is not None:  # per process: give each worker its own port
            metrics.start_metrics_server(settings.metrics_port, settings.metrics_addr)
        config = ReaperConfig.from_settings(settings)
        heartbeat = self._heartbeat = Heartbeat(r, self.name, self.node,
                                                config.liveness.heartbeat_s)
        heartbeat.start()
        self._publish_sandbox()
        self._publish_slots()
        # Recovered turns run here, beside the pool (see Recoveries), at most a pool's worth.
        recoveries = self._recoveries = Recoveries(
            lambda conv: self.dispatcher(self.name).dispatch(conv), self.kick,
            limit=settings.worker_concurrency)
        sweeps = self.sweeps()
        self._reaper = Reaper(lambda: reap(
            r, config, recover=recoveries, kick=self.kick,
            republish=lambda message: republish(self.app, message),
            may_declare_dead=heartbeat.healthy_for() >= config.liveness.dead_s,
            sweeps=sweeps,
        ), config.liveness.heartbeat_s)
        self._reaper.start()

    def _warm_up(self) -> None:
        """Import the SDKs and build the clients now, not inside the first turn (~1.5 s)."""
        _ = self.turn_runner
        try:
            self.router()
        except ConfigError as e:  # reported by every turn until fixed; the worker still starts
            log.error("provider not usable: %s", e)

    def _publish_slots(self) -> None:
        """This process's concurrent turns, for the console's Fleet view."""
        from fermix_shared.stores import fleet

        try:
            fleet.publish_slots(self.redis, self.name, self.settings.worker_concurrency)
        except Exception:
            log.warning("could not publish this worker's slots", exc_info=True)

    def _publish_sandbox(self) -> None:
        """How this worker runs commands, for `fermix doctor` and /v1/status (other hosts)."""
        from fermix_shared.stores import sandbox as sandbox_store

        try:
            sandbox_store.publish(self.redis, self.node, sandbox_report(self.settings))
        except Exception:
            log.warning("could not publish this worker's sandbox state", exc_info=True)

    def stop(self) -> None:
        """The bootstep's stop (the consumer has stopped; the pool still runs): as at SIGTERM."""
        self.shutting_down()

    def shutting_down(self) -> None:
        """SIGTERM (or Ctrl-C): Celery stops consuming and waits for its pool. Start no more
        recoveries, and give the turns in flight the grace before handing them over. Returns
        at once (it runs inside a signal handler)."""
        if self._reaper is not None:
            self._reaper.stop()
        if self.stopping is None:
            self.stopping = GracefulStop(self.settings.worker_shutdown_grace, self._stopped)
        self.stopping.begin()

    def shutdown(self) -> None:
        """Celery's pool has finished its tasks (or handed them over at the grace); recovered
        turns run beside it: let them finish within the grace too (the heartbeat still says we
        are alive), then say we stopped and end the leases still held, so that whatever is left
        resumes elsewhere at once."""
        log.info("worker pool stopped; stopping")
        if self._reaper is not None:
            self._reaper.stop()
        grace = self.settings.worker_shutdown_grace
        if self._recoveries is not None and not self._recoveries.drain(grace + 5):
            log.warning("stopping with %d recovered turn(s) still running",
                        self._recoveries.running())
        if self.stopping is not None:
            self.stopping.end()
        with contextlib.suppress(Exception):
            self._stopped()

    def _stopped(self) -> None:
        """Say this process stopped (a heartbeat of 0; no beat follows) and end the leases it
        still holds, dispatching those conversations: another worker resumes them now."""
        if self._heartbeat is not None:
            self._heartbeat.mark_stopped()
            release_held(self.redis, self._heartbeat.worker, self.kick)

