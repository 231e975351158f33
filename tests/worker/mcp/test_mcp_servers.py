"""MCP servers as tools against real servers: the reference "everything" server (from npm, run
with node over stdio: a server nobody here wrote) and a FastMCP server over streamable HTTP on
127.0.0.1 (tests/fakes/mcp_server.py), through the real host process and the tool registry.

Failure: a stdio child or an HTTP server killed mid-call, the host process killed, a tool that
hangs, a server that cannot start. Cancellation: a call past its timeout, or given up by the
worker, is cancelled on the server (stdio and HTTP). Concurrency: 50 calls from greenlets of a
monkey-patched process, and from threads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix_shared.mcp_config import McpServerConfig
from fermix_shared.messages import ToolCall
from fermix_worker.mcp.tools import LiveTools, McpTools, ToolsWithMcp, process_mcp_tools
from fermix_worker.subagents.registry import SubagentTools
from fermix_worker.tools import (
    BUILTIN_TOOLS,
    GUEST,
    OPERATOR,
    RunContext,
    ToolRegistry,
    ToolResult,
)
from fermix_worker.tools.fence import FENCE_NOTICE
from tests.fakes.mcp_everything import everything_js, everything_server
from tests.fakes.mcp_server import INJECTION, serve_http, stdio_server

pytestmark = pytest.mark.fleet

ROOT = Path(__file__).resolve().parents[3]
TOKEN_VAR = "FERMIX_TEST_MCP_TOKEN"
PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def payload(result: ToolResult, tool: str) -> str:
    """The fenced payload of an MCP tool's result (asserting the fence)."""
    head = f'<untrusted_tool_result tool="{tool}">\n{FENCE_NOTICE}\n'
    assert result.content.startswith(head), result.content
    assert result.content.endswith("\n</untrusted_tool_result>")
    return result.content[len(head):-len("\n</untrusted_tool_result>")]


def run(registry: ToolRegistry, name: str, **arguments: Any) -> ToolResult:
    return registry.execute(ToolCall(id=f"call-{name}", name=name, arguments=arguments),
                            RunContext())


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        started = time.monotonic()
        box["value"] = fn()
        box["seconds"] = time.monotonic() - started

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


@pytest.fixture(scope="module")
def everything() -> McpServerConfig:
    """Installs the pinned everything server from npm into .cache/mcp/ if missing."""
    return everything_server()


@pytest.fixture(scope="module")
def http_url(logs_dir: Path) -> Iterator[str]:
    proc, url = serve_http(logs_dir / "mcp-test-server.log")
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def mcp(everything: McpServerConfig, http_url: str) -> Iterator[McpTools]:
    """One host for the tests that break nothing: the everything server, the FastMCP server
    (with a header from an env var), and the same FastMCP server again as a guest-usable
    read_only server, as a read_write one and with a short timeout."""
    os.environ[TOKEN_VAR] = "t0k3n"
    tools = McpTools([
        everything,
        McpServerConfig(name="test", url=http_url,
                        headers={"Authorization": f"Bearer ${{{TOKEN_VAR}}}"}),
        McpServerConfig(name="readonly", url=http_url, policy="read_only", trust="guest"),
        McpServerConfig(name="writer", url=http_url, policy="read_write"),
        McpServerConfig(name="impatient", url=http_url, timeout_seconds=1.5),
        McpServerConfig(name="off", url=http_url, enabled=False),
    ])
    yield tools
    tools.close()
    os.environ.pop(TOKEN_VAR, None)


@pytest.fixture(scope="module")
def registry(mcp: McpTools) -> ToolRegistry:
    return ToolsWithMcp([], mcp).scoped(OPERATOR)


def test_the_tools_of_every_server_are_listed_under_namespaced_names(
    registry: ToolRegistry,
) -> None:
    specs = {s.name: s for s in registry.specs()}
    assert {"everything__echo", "everything__get-sum", "everything__trigger-long-running-operation",
            "test__add", "test__slow", "readonly__add", "writer__add"} <= set(specs)
    assert not any(n.startswith("off__") for n in specs)
    assert all(PROVIDER_NAME.match(n) for n in specs)
    assert specs["everything__echo"].description == "Echoes back the input string"
    # Input schemas reach the model as the servers gave them.
    get_sum = specs["everything__get-sum"].parameters
    assert set(get_sum["properties"]) == {"a", "b"} and set(get_sum["required"]) == {"a", "b"}
    assert specs["test__add"].parameters["properties"] == {
        "a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}}


def test_an_everything_server_tool_answers_fenced(registry: ToolRegistry) -> None:
    echoed = run(registry, "everything__echo", message="hello from fermix")
    assert not echoed.is_error
    assert payload(echoed, "everything__echo") == "Echo: hello from fermix"
    summed = run(registry, "everything__get-sum", a=2, b=3)
    assert payload(summed, "everything__get-sum") == "The sum of 2 and 3 is 5."
    image = run(registry, "everything__get-tiny-image")
    assert re.search(r"\[image: image/png, \d+ bytes, not shown\]", payload(
        image, "everything__get-tiny-image"))


def test_a_fastmcp_tool_answers_over_http_with_a_header_from_the_environment(
    registry: ToolRegistry,
) -> None:
    assert payload(run(registry, "test__add", a=2, b=40), "test__add") == "2 + 40 = 42"
    assert payload(run(registry, "test__auth_header"), "test__auth_header") == "Bearer t0k3n"
    assert payload(run(registry, "readonly__auth_header"), "readonly__auth_header") == "none"


def test_a_result_cannot_close_its_fence(registry: ToolRegistry) -> None:
    body = payload(run(registry, "test__inject"), "test__inject")
    assert body == INJECTION.replace("</untrusted_tool_result>", "&lt;/untrusted_tool_result>")


def test_a_failing_tool_and_a_bad_call_are_error_results(registry: ToolRegistry) -> None:
    boom = run(registry, "test__boom")
    assert boom.is_error
    assert payload(boom, "test__boom").startswith(
        "Error: MCP server 'test': boom failed: Error executing tool boom: "
        "the boom tool always fails")
    wrong = run(registry, "test__add", a="two")
    assert wrong.is_error and "MCP server 'test': add failed" in wrong.content


def test_trust_and_policy_apply_to_mcp_tools(mcp: McpTools) -> None:
    tools = ToolsWithMcp([], mcp)
    guest = {s.name for s in tools.scoped(GUEST).specs()}
    assert guest and all(n.startswith("readonly__") for n in guest)
    refused = run(tools.scoped(GUEST), "test__add", a=1, b=1)
    assert refused.is_error and "operators only" in refused.content
    # Subagents get them minus read_write.
    sub = SubagentTools(mcp.tools(), "operator")
    names = {s.name for s in sub.specs()}
    assert "everything__echo" in names and "test__add" in names
    assert not any(n.startswith("writer__") for n in names)
    assert "needs read_write access" in run(sub, "writer__add", a=1, b=1).content


def test_subagents_get_the_mcp_tools_known_when_each_job_starts(http_url: str) -> None:
    """What subagent_tasks.py gives its SubagentRunner: Fermix's tools and, each time a
    subagent's registry is built, the MCP tools this process knows (minus read_write)."""
    servers = [McpServerConfig(name="test", url=http_url),
               McpServerConfig(name="writer", url=http_url, policy="read_write")]
    live = LiveTools(BUILTIN_TOOLS, servers)
    try:
        sub = SubagentTools(live, "operator")
        names = {s.name for s in sub.specs()}
        assert "test__add" in names and "http_fetch" in names
        assert not any(n.startswith("writer__") for n in names)
        assert payload(run(sub, "test__add", a=5, b=5), "test__add") == "5 + 5 = 10"
        assert [t.name for t in live] == [t.name for t in live]  # listed once, then cached
    finally:
        process_mcp_tools(servers).close()


def test_a_stdio_server_killed_mid_call_gives_an_error_then_restarts(
    everything: McpServerConfig,
) -> None:
    mcp = McpTools([everything])
    try:
        registry = ToolsWithMcp([], mcp).scoped(OPERATOR)
        host = mcp.host.pid
        assert host is not None
        (child,) = children(host)
        thread, box = in_thread(lambda: run(registry, "everything__trigger-long-running-operation",
                                            duration=30, steps=3))
        time.sleep(1.0)
        os.kill(child, signal.SIGKILL)
        thread.join(10)
        result = box["value"]
        assert result.is_error and box["seconds"] < 3
        assert ("Error: MCP server 'everything' went away during the call to "
                "'trigger-long-running-operation' (the server closed the connection); "
                "it is restarted on the next call") in result.content
        again = run(registry, "everything__echo", message="back")
        assert payload(again, "everything__echo") == "Echo: back"
        assert children(host) != [child] and mcp.host.pid == host
    finally:
        mcp.close()


def test_an_http_server_killed_mid_call_gives_an_error_then_reconnects_when_it_is_back(logs_dir: Path) -> None:
    server, url = serve_http(logs_dir / "mcp-test-server-killed.log")
    mcp = McpTools([McpServerConfig(name="test", url=url, timeout_seconds=30)])
    try:
        registry = ToolsWithMcp([], mcp).scoped(OPERATOR)
        thread, box = in_thread(lambda: run(registry, "test__slow", seconds=20))
        time.sleep(1.0)
        server.kill()
        server.proc.wait()
        thread.join(15)
        assert box["value"].is_error and box["seconds"] < 6, box
        assert "Error: MCP server 'test' went away during the call to 'slow'" in \
            box["value"].content
        down = run(registry, "test__add", a=1, b=2)
        assert down.is_error and "MCP server 'test' could not be started: ConnectError" in \
            down.content
        port = int(url.split(":")[-1].split("/")[0])
        server, _ = serve_http(logs_dir / "mcp-test-server-restarted.log", port=port)
        assert payload(run(registry, "test__add", a=1, b=2), "test__add") == "1 + 2 = 3"
        # Restarted between two calls: the new server does not know our session; replaced.
        server.stop()
        server, _ = serve_http(logs_dir / "mcp-test-server-restarted-again.log", port=port)
        assert payload(run(registry, "test__add", a=2, b=2), "test__add") == "2 + 2 = 4"
    finally:
        mcp.close()
        server.stop()


def test_a_hanging_tool_times_out_within_its_bound(registry: ToolRegistry) -> None:
    started = time.monotonic()
    hung = run(registry, "impatient__slow", seconds=60)
    assert time.monotonic() - started < 3.0
    assert hung.is_error and ("Error: MCP server 'impatient' did not answer the call to 'slow' "
                              "within 1.5 s") in hung.content
    # The server itself still answers: same session, nothing restarted.
    assert payload(run(registry, "impatient__add", a=1, b=1), "impatient__add") == "1 + 1 = 2"


def holding_server(transport: str, http_url: str, timeout_seconds: float) -> McpServerConfig:
    """The test server as "held", over ``transport``, for its ``hold`` tool."""
    if transport == "stdio":
        return stdio_server("held", timeout_seconds=timeout_seconds)
    return McpServerConfig(name="held", url=http_url, timeout_seconds=timeout_seconds)


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_a_call_past_its_timeout_is_cancelled_on_the_server(transport: str, http_url: str) -> None:
    mcp = McpTools([holding_server(transport, http_url, timeout_seconds=4)])
    try:
        registry = ToolsWithMcp([], mcp).scoped(OPERATOR)
        tag = f"timeout-{transport}"
        started = time.monotonic()
        held = run(registry, "held__hold", tag=tag)  # (a stdio server takes a while to start)
        assert time.monotonic() - started < 6.0
        assert held.is_error and ("Error: MCP server 'held' did not answer the call to 'hold' "
                                  "within 4 s") in held.content
        # The server got notifications/cancelled for it: the tool's wait was cancelled.
        cancelled = run(registry, "held__was_cancelled", tag=tag)
        assert payload(cancelled, "held__was_cancelled") == "yes"
    finally:
        mcp.close()


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_a_call_the_worker_gives_up_is_cancelled_on_the_server(
    transport: str, http_url: str,
) -> None:
    """What a tool timeout or a /stop does to a call in flight (McpHost.request's wait cut
    short): the host cancels it, well before its own timeout of 30 s."""
    mcp = McpTools([holding_server(transport, http_url, timeout_seconds=30)])
    try:
        host, tag = mcp.host, f"given-up-{transport}"
        reply = host.submit("call", "held", tool="hold", arguments={"tag": tag})
        assert host.request("call", "held", 10, tool="held", arguments={"tag": tag})["text"] == "yes"
        host.cancel(reply)
        answer = host.request("call", "held", 10, tool="was_cancelled", arguments={"tag": tag})
        assert answer["text"] == "yes"
    finally:
        mcp.close()


def test_a_dead_host_process_fails_the_calls_in_flight_and_is_restarted(http_url: str) -> None:
    mcp = McpTools([McpServerConfig(name="test", url=http_url)])
    try:
        registry = ToolsWithMcp([], mcp).scoped(OPERATOR)
        host = mcp.host.pid
        assert host is not None
        thread, box = in_thread(lambda: run(registry, "test__slow", seconds=20))
        time.sleep(1.0)
        os.kill(host, signal.SIGKILL)
        thread.join(10)
        assert box["value"].is_error and box["seconds"] < 3
        assert ("Error: MCP server 'test' could not be reached: the MCP host process exited "
                "with code -9; it is restarted on the next call") in box["value"].content
        assert payload(run(registry, "test__add", a=3, b=4), "test__add") == "3 + 4 = 7"
        assert mcp.host.pid not in (None, host)
    finally:
        mcp.close()


def test_a_server_that_cannot_start_is_left_out_with_a_warning(
    http_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    mcp = McpTools([
        McpServerConfig(name="missing", command="/nonexistent/mcp-server"),
        McpServerConfig(name="mute", command=sys.executable,
                        args=["-c", "import time; time.sleep(60)"], timeout_seconds=1),
        McpServerConfig(name="nokey", url="http://127.0.0.1:1/mcp",
                        headers={"Authorization": "Bearer ${FERMIX_TEST_UNSET_VARIABLE}"}),
        McpServerConfig(name="test", url=http_url),
    ])
    try:
        with caplog.at_level(logging.WARNING, logger="fermix_worker.mcp.tools"):
            started = time.monotonic()
            names = {t.name for t in mcp.tools()}
            assert time.monotonic() - started < 5
        assert "test__add" in names
        assert not any(n.split("__")[0] in {"missing", "mute", "nokey"} for n in names)
        warnings = "\n".join(r.getMessage() for r in caplog.records)
        assert ("MCP server 'missing' could not be started: FileNotFoundError: [Errno 2] "
                "No such file or directory: '/nonexistent/mcp-server'") in warnings
        assert "MCP server 'mute' did not start within 1 s" in warnings
        assert ("MCP server 'nokey' could not be started: ValueError: header Authorization "
                "needs the environment variable FERMIX_TEST_UNSET_VARIABLE, which is not set"
                ) in warnings
        assert "its tools are left out, trying again in 30 s" in warnings
    finally:
        mcp.close()


def test_fifty_calls_from_greenlets_run_at_once_without_blocking_the_hub(
    everything: McpServerConfig, http_url: str,
) -> None:
    """In a process monkey-patched like a gevent worker: 25 calls of a 1 s tool and 25 echoes
    from 50 greenlets take about one second, not 25, and a 10 ms ticker keeps ticking."""
    servers = json.dumps([everything.model_dump(mode="json"),
                          McpServerConfig(name="test", url=http_url).model_dump(mode="json")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.fakes.mcp_gevent_load", "50", "1.0", servers],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["done"], out["errors"], out["slept"], out["echoed"]) == (50, [], 25, 25)
    assert out["wall"] < 4.0, out  # 25 s if the calls ran one after another
    assert out["max_gap"] < 0.5, out  # the hub was never blocked (a call takes 1 s)


def test_calls_from_threads_run_at_once(registry: ToolRegistry) -> None:
    """The threads pool (and tests): plain blocking waits, still concurrent."""
    boxes = [in_thread(lambda: run(registry, "test__slow", seconds=1.0)) for _ in range(20)]
    started = time.monotonic()
    for thread, _ in boxes:
        thread.join(30)
    assert time.monotonic() - started < 4.0
    assert all(payload(box["value"], "test__slow") == "slept 1 s" for _, box in boxes)


def test_the_everything_server_is_installed_in_the_gitignored_cache() -> None:
    entry = everything_js()
    assert entry.is_relative_to(ROOT / ".cache" / "mcp") and entry.is_file()
    ignored = subprocess.run(["git", "check-ignore", "-q", str(entry)], cwd=ROOT)
    assert ignored.returncode == 0
