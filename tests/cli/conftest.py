"""Fixtures of the CLI's tests: the real gateway app served in a thread of this process."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import uvicorn

from fermix_dev.procs import free_port, wait_until
from fermix_gateway.app import create_app
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.gateway.inprocess import RecordingCelery

TOKEN = "cli-t0k"


@pytest.fixture(scope="module")
def served(scratch_redis_url: str) -> Iterator[tuple[str, RecordingCelery]]:
    """The gateway (its URL, bearer ``TOKEN``) over the scratch Redis, agents ``default``,
    ``ops`` and the sub agent ``helper``; the Celery tasks it sends are recorded."""
    settings = Settings(redis_url=scratch_redis_url, api_token=TOKEN,
                        agents=[AgentDefinition(name="ops"), AgentDefinition(name="helper",
                                                                             role="sub")])
    app = create_app(settings, hooks=HookRegistry())
    celery = RecordingCelery()
    app.state.tasks = celery
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "in-process gateway")
    yield f"http://127.0.0.1:{port}", celery
    server.should_exit = True
    thread.join(10)
