"""Process-wide worker objects, built lazily under a lock (many greenlets start at once)."""

from __future__ import annotations

import os
import socket
import threading

from fermix_shared.channels.registry import outbound
from fermix_shared.hooks import get_hooks
from fermix_shared.redis_client import get_redis
from fermix_shared.settings import get_settings
from fermix_worker.providers import get_router
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.turn import TurnRunner

_lock = threading.Lock()
_runner: TurnRunner | None = None


def turn_runner() -> TurnRunner:
    global _runner
    if _runner is None:
        with _lock:
            if _runner is None:
                settings = get_settings()
                _runner = TurnRunner(
                    get_redis(), settings, ToolRegistry(BUILTIN_TOOLS),
                    router=lambda: get_router(settings), channels=outbound, hooks=get_hooks(),
                )
    return _runner


def worker_name(hostname: str | None) -> str:
    """Unique per process: Celery's node name plus pid."""
    return f"{hostname or socket.gethostname()}:{os.getpid()}"
