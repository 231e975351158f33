"""http_fetch's server and backends (tests/worker/tools/fetch_server.py) as fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fermix_worker.tools.web import CheckedBackend
from tests.worker.tools.fetch_server import (
    PUBLIC,
    RecordingConnector,
    ScriptedResolver,
    Server,
    serving,
)


@pytest.fixture(scope="module")
def _server() -> Iterator[Server]:
    with serving() as srv:
        yield srv


@pytest.fixture
def server(_server: Server) -> Server:
    _server.requests.clear()
    return _server


@pytest.fixture
def page_backend(server: Server) -> CheckedBackend:
    """Resolves public.test to the "public" address that connects to the test server."""
    return CheckedBackend(ScriptedResolver({"public.test": [[PUBLIC]]}),
                          RecordingConnector(local_port=server.server_address[1]))
