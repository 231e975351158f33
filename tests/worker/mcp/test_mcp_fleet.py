"""MCP tools in a real fleet: a gateway and a ``celery worker`` (gevent pool) configured with
``FERMIX_MCP_SERVERS``: the reference "everything" server (npm, stdio) and a FastMCP server
(streamable HTTP on 127.0.0.1). A turn calls a tool of each and answers with their results;
the model got them fenced. A /stop while an MCP tool runs cancels the call on the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.mcp_config import McpServerConfig
from fermix_shared.messages import ToolCall
from fermix_worker.mcp.tools import McpTools, ToolsWithMcp
from fermix_worker.tools import OPERATOR, RunContext
from fermix_worker.tools.fence import FENCE_NOTICE
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.mcp_everything import everything_server
from tests.fakes.mcp_server import serve_http
from tests.fleet import start, turn_calls, uniq, wait

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def mcp_url(logs_dir: Path) -> Iterator[str]:
    """The FastMCP test server over streamable HTTP (tests/fakes/mcp_server.py)."""
    server, url = serve_http(logs_dir / "mcp-fleet-server.log")
    yield url
    server.stop()


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, mcp_url: str
          ) -> Iterator[Stack]:
    servers = [everything_server().model_dump(mode="json"), {"name": "test", "url": mcp_url}]
    env = {**provider_env(llm, "openai"), "FERMIX_MCP_SERVERS": json.dumps(servers)}
    s = start_stack("mcp", redis_url, 10, env, logs_dir, workers=1)
    yield s
    s.stop()


def fenced(tool: str, text: str) -> str:
    return f'<untrusted_tool_result tool="{tool}">\n{FENCE_NOTICE}\n{text}\n</untrusted_tool_result>'


def test_a_turn_calls_an_everything_tool_and_a_fastmcp_tool_and_answers_with_their_results(
    stack: Stack, llm: ScriptedLLMServer,
) -> None:
    text = uniq("mcp")
    answer = "The server echoed 'fleet' and 20 + 22 is 42."
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("everything__echo", {"message": "fleet"}),
                          ToolCallSpec("test__add", {"a": 20, "b": 22})], match=text),
        Reply(text=answer, match=text),
    )
    with stack.http() as http:
        out = wait(http, start(http, text, uniq("chat")), timeout=60)
    assert out["status"] == "ok", out
    assert out["reply"] == answer

    first, second = [r["body"] for r in turn_calls(llm.script.requests)
                     if text in json.dumps(r["body"])]
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert {"everything__echo", "everything__get-sum", "test__add", "test__slow"} <= set(offered)
    assert offered["everything__echo"]["parameters"]["properties"]["message"]["type"] == "string"
    results: dict[str, Any] = {m["tool_call_id"]: m["content"] for m in second["messages"]
                               if m["role"] == "tool"}
    calls = {c["function"]["name"]: c["id"] for m in second["messages"]
             if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    assert results[calls["everything__echo"]] == fenced("everything__echo", "Echo: fleet")
    assert results[calls["test__add"]] == fenced("test__add", "20 + 22 = 42")


def test_a_stop_while_an_mcp_tool_runs_cancels_the_call_on_the_server(
    stack: Stack, llm: ScriptedLLMServer, mcp_url: str,
) -> None:
    """The worker gives the call up (the /stop interrupts the turn where it blocks) and the
    server gets ``notifications/cancelled`` for it: no call is left running there."""
    text, chat, tag = uniq("mcp-stop"), uniq("chat"), uniq("stopped")
    llm.script.push(Reply(tool_calls=[ToolCallSpec("test__hold", {"tag": tag})], match=text))
    probe = McpTools([McpServerConfig(name="probe", url=mcp_url)])  # the test's own session
    tools = ToolsWithMcp([], probe).scoped(OPERATOR)

    def said(tool: str) -> str:
        result = tools.execute(ToolCall(id="probe", name=tool, arguments={"tag": tag}),
                               RunContext())
        return result.content.rsplit("\n", 2)[-2]  # the fenced payload's one line

    try:
        with stack.http() as http:
            run_id = start(http, text, chat)
            wait_until(lambda: said("probe__held") == "yes", 20, "the hold call on the server")
            assert said("probe__was_cancelled") == "no"  # it runs
            assert wait(http, start(http, "/stop", chat))["status"] == "ok"
            assert wait(http, run_id)["status"] == "stopped"
        # The cancel is on its way through the host process to the server: each ask waits 1 s.
        wait_until(lambda: said("probe__was_cancelled") == "yes", 10, "the cancel on the server")
    finally:
        probe.close()
