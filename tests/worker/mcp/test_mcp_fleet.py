"""MCP tools in a real fleet: a gateway and a ``celery worker`` (gevent pool) configured with
``FERMIX_MCP_SERVERS``: the reference "everything" server (npm, stdio) and a FastMCP server
(streamable HTTP on 127.0.0.1). A turn calls a tool of each and answers with their results;
the model got them fenced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_worker.tools.fence import FENCE_NOTICE
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.mcp_everything import everything_server
from tests.fakes.mcp_server import serve_http
from tests.fleet import start, turn_calls, uniq, wait

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    server, url = serve_http(logs_dir / "mcp-fleet-server.log")
    servers = [everything_server().model_dump(mode="json"), {"name": "test", "url": url}]
    env = {**provider_env(llm, "openai"), "FERMIX_MCP_SERVERS": json.dumps(servers)}
    try:
        s = start_stack("mcp", redis_url, 10, env, logs_dir, workers=1)
    except Exception:
        server.stop()
        raise
    yield s
    s.stop()
    server.stop()


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
