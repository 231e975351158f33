"""Subagents get the parent turn's tools, never more: a gateway and one ``celery worker`` with
an MCP server (FastMCP over streamable HTTP on 127.0.0.1) and ``[[agents]]`` narrower than
their trust. The proof is the tool list the scripted model is offered in each subagent's call:
an agent's policy classes and tool list bound its subagents, and a call's ``tools`` list
narrows them further but never adds a tool the parent lacks (issue 25)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.agents.definitions import AgentDefinition
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.mcp_server import serve_http
from tests.fleet import post, uniq, wait

AGENTS = [
    AgentDefinition(name="narrow", allowed_tools=["subagents", "calculator"]),
    AgentDefinition(name="reader", policy=["read_only", "exec"]),
]
MCP_TOOLS = sorted(f"test__{t}" for t in (
    "add", "auth_header", "boom", "held", "hold", "inject", "pid", "shout", "slow",
    "was_cancelled"))
# Subagents list, view and run skills (skill_run inline: issue 27), as their parent can.
SKILL_TOOLS = ["skill_list", "skill_run", "skill_view"]


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    """A gateway and a worker with AGENTS and the test MCP server (stopped after them)."""
    server, mcp = serve_http(logs_dir / "subagent-tools-mcp.log")
    try:
        env = {**provider_env(llm, "openai"),
               "FERMIX_AGENTS": json.dumps([a.model_dump(mode="json", exclude_none=True)
                                            for a in AGENTS]),
               "FERMIX_MCP_SERVERS": json.dumps([{"name": "test", "url": mcp}])}
        s = start_stack("subagent-tools", redis_url, 7, env, logs_dir, workers=1)
        yield s
        s.stop()
    finally:
        server.stop()


def offered(llm: ScriptedLLMServer, last: str) -> list[list[str]]:
    """The tools offered in each model call whose last message is ``last``."""
    return [sorted(t["function"]["name"] for t in q["body"].get("tools", []))
            for q in llm.script.requests if q["body"]["messages"][-1].get("content") == last]


def test_subagents_are_offered_the_parent_turn_s_tools_and_never_more(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Today: an agent with `allowed_tools = ["subagents", ...]` or a `policy` without
    # `network` fanned out subagents offered http_fetch and every MCP tool (the trust's
    # defaults), whatever the parent turn itself was offered.
    cases: dict[str, tuple[str, list[str] | None]] = {
        "plain": ("default", None),  # the control: an operator's turn, every class
        "plain-narrowed": ("default", ["current_time", "test__add", "write_file"]),
        "narrow": ("narrow", None),  # allowed_tools = subagents, calculator
        "narrow-widened": ("narrow", ["calculator", "http_fetch", "test__add"]),
        "reader": ("reader", None),  # policy = read_only, exec
    }
    tasks = {case: uniq(f"tools-{case}") for case in cases}
    users = {case: uniq(f"fan-{case}") for case in cases}
    for case, (_, tools) in cases.items():
        args: dict[str, Any] = {"tasks": [tasks[case]]}
        if tools is not None:
            args["tools"] = tools
        llm.script.push(
            Reply(tool_calls=[ToolCallSpec("subagents", args)], match=users[case]),
            Reply(text=f"done {case}", match=tasks[case]),
            Reply(text=f"synthesized {case}", match=users[case]),
        )
    with stack.http() as http:
        started = {}
        for case, (agent, _) in cases.items():
            resp = post(http, users[case], uniq("chat"), agent=agent)
            assert resp.status_code == 202, resp.text
            started[case] = resp.json()["runId"]
        done = {case: wait(http, run_id, timeout=60) for case, run_id in started.items()}
    assert {case: run.get("reply") for case, run in done.items()} == {
        case: f"synthesized {case}" for case in cases}
    subagent = {case: offered(llm, task) for case, task in tasks.items()}
    assert subagent == {
        "plain": [sorted(["calculator", "current_time", "http_fetch", *MCP_TOOLS,
                          *SKILL_TOOLS])],
        "plain-narrowed": [["current_time", "test__add"]],  # write_file: never for subagents
        "narrow": [["calculator"]],
        "narrow-widened": [["calculator"]],  # a per-call list adds nothing the parent lacks
        # No network, no external_api (MCP).
        "reader": [sorted(["calculator", "current_time", *SKILL_TOOLS])],
    }
    # The narrow parent itself was offered exactly its list.
    assert offered(llm, users["narrow"])[0] == ["calculator", "subagents"]

