"""Process-wide worker objects, built lazily under a lock (many greenlets start at once)."""

from __future__ import annotations

import os
import socket
import threading
import uuid

from fermix_shared.celery_app import app as celery_app
from fermix_shared.channels.registry import outbound
from fermix_shared.hooks import get_hooks
from fermix_shared.memory import MemoryStore
from fermix_shared.redis_client import get_redis
from fermix_shared.scheduling.firing import kick_dispatch
from fermix_shared.settings import get_settings
from fermix_shared.skills import SkillRegistry
from fermix_worker import usage_meter
from fermix_worker.compaction.conversation import ConversationCompactor
from fermix_worker.compaction.listener import ScheduleCompaction
from fermix_worker.mcp.tools import with_mcp_tools
from fermix_worker.memory_tasks import review_ended_turn
from fermix_worker.providers import get_router
from fermix_worker.scheduler import RecordJobRun
from fermix_worker.subagents.fanout import CeleryFanOut
from fermix_worker.subagents.skill_tool import SKILL_RUN_TOOL
from fermix_worker.subagents.tool import SUBAGENTS_TOOL
from fermix_worker.tools import BUILTIN_TOOLS
from fermix_worker.tools.command import command_tools
from fermix_worker.tools.files import file_tools
from fermix_worker.tools.memory import memory_tools
from fermix_worker.tools.schedule import schedule_tools
from fermix_worker.tools.skills import skill_tools
from fermix_worker.turn import TurnRunner
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.usage_budgets import WarnOnBudget
from fermix_worker.usage_meter import UsageMeter

_lock = threading.Lock()
_runner: TurnRunner | None = None


def turn_runner() -> TurnRunner:
    global _runner
    if _runner is None:
        with _lock:
            if _runner is None:
                settings = get_settings()
                r = get_redis()
                # Every model call this process makes is counted (usage_meter.py).
                usage_meter.install(
                    UsageMeter.from_settings(r, settings) if settings.usage.enabled else None)
                skills = SkillRegistry(r, settings.home)
                listeners = TurnListeners([
                    RecordJobRun(r),
                    WarnOnBudget(r, settings, outbound),
                    review_ended_turn,
                    ScheduleCompaction(
                        r, ConversationCompactor(r, settings, lambda: get_router(settings)),
                        kick_dispatch),
                ])
                _runner = TurnRunner(
                    get_redis(), settings, with_mcp_tools(settings.mcp_servers, [
                        *BUILTIN_TOOLS,
                        *schedule_tools(get_redis, kick_dispatch, settings.turn_timeout),
                        SUBAGENTS_TOOL,
                        *memory_tools(lambda: MemoryStore(get_redis())),
                        *skill_tools(lambda: skills),
                        SKILL_RUN_TOOL,
                        # Only when a workspace is configured (settings or an agent).
                        *file_tools(settings),
                        *command_tools(settings),
                    ], timeout_s=settings.tool_timeout_seconds),
                    router=lambda: get_router(settings), channels=outbound, hooks=get_hooks(),
                    fanout=CeleryFanOut(celery_app, settings, lambda: skills),
                    listeners=listeners,
                    skills=skills,
                )
    return _runner


# Told apart from an earlier process of the same node and pid (a restarted container's worker
# is pid 1 again): a heartbeat must never vouch for a dead process's turns.
_INSTANCE = uuid.uuid4().hex[:6]


def worker_name(hostname: str | None) -> str:
    """Unique per process: Celery's node name, pid and a per-start nonce. Turns record it as
    their holder and the process's heartbeat is written under it (the reaper matches the two)."""
    return f"{hostname or socket.gethostname()}:{os.getpid()}:{_INSTANCE}"
