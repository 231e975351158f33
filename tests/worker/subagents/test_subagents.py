"""The subagents tool as plain Python: caps, argument checks, /ultra's owner-only rule, the
subagent's prompt, tool set and routes, and result merging (byte shares, UTF-8 cuts, order,
statuses, counts)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fermix_gateway.commands import Caller, Command, handle
from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, RunProfile
from fermix_shared.settings import Settings
from fermix_worker.loop_state import ITERATION_CAPS
from fermix_worker.providers.base import ToolSpec
from fermix_worker.subagents import caps as caps_mod
from fermix_worker.subagents.caps import REGULAR, ULTRA, caps_for
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.subagents.fanout import CeleryFanOut, FanOutMeta
from fermix_worker.subagents.prompts import (
    NESTED_CALL_ERROR,
    RESULT_FORMAT_INSTRUCTIONS,
    SUBAGENT_SYSTEM_PROMPT,
    subagent_system_prompt,
)
from fermix_worker.subagents.registry import SubagentTools
from fermix_worker.subagents.results import (
    SubagentReport,
    byte_shares,
    cut_utf8,
    merge,
    normalize,
)
from fermix_worker.subagents.routing import subagent_routes
from fermix_worker.subagents.runner import SubagentJob, crash_report
from fermix_worker.subagents.tool import SUBAGENTS_TOOL, ArgsError, for_profile, parse_args
from fermix_worker.tools import BUILTIN_TOOLS, RunContext, Tool, ToolRegistry, ToolScope
from tests.seed_text import quoted

# --- caps -------------------------------------------------------------------------------


def test_regular_and_ultra_caps_are_the_seeds() -> None:
    assert (REGULAR.max_tasks, REGULAR.concurrency, REGULAR.timeout_s, REGULAR.max_iterations,
            REGULAR.result_bytes) == (10, 4, 300.0, 100, 60_000)
    assert (ULTRA.max_tasks, ULTRA.concurrency, ULTRA.max_iterations, ULTRA.result_bytes) == (
        50, 12, 40, 300_000)
    assert REGULAR.max_tasks <= caps_mod.HARD_MAX_TASKS
    assert REGULAR.concurrency <= caps_mod.HARD_MAX_CONCURRENCY
    assert REGULAR.max_iterations <= caps_mod.HARD_MAX_ITERATIONS
    assert REGULAR.result_bytes <= caps_mod.HARD_MAX_RESULT_BYTES
    assert REGULAR.max_iterations == ITERATION_CAPS["subagent"]
    assert ULTRA.max_iterations == ITERATION_CAPS["ultra_subagent"]
    assert caps_for("ultra") is ULTRA and caps_for("default") is REGULAR


def test_timeout_knob_is_clamped_to_the_hard_maximum() -> None:
    assert caps_for("default", 2).timeout_s == 2
    assert caps_for("default", 5000).timeout_s == 900
    assert Settings().subagent_timeout_seconds == 300
    with pytest.raises(ValueError):
        Settings(subagent_timeout_seconds=901)


def test_the_parked_turn_waits_for_every_wave() -> None:
    fan = CeleryFanOut(None, Settings())  # type: ignore[arg-type]
    ten = ToolCall(id="c", name="subagents", arguments={"tasks": ["t"] * 10})
    # ceil(10 / 4) = 3 waves of 300 s, queueing slack, callback margin.
    assert fan.deadline(ten, "default") == 3 * 300 + caps_mod.QUEUE_SLACK_S + caps_mod.CALLBACK_MARGIN_S
    fifty = ToolCall(id="c", name="subagents", arguments={"tasks": ["t"] * 50})
    assert fan.deadline(fifty, "ultra") == 5 * 300 + caps_mod.QUEUE_SLACK_S + caps_mod.CALLBACK_MARGIN_S
    bad = ToolCall(id="c", name="subagents", arguments={"tasks": "oops"})
    assert fan.deadline(bad, "default") == caps_mod.CALLBACK_MARGIN_S


# --- the tool and its arguments ---------------------------------------------------------


def test_the_tool_parks_instead_of_running() -> None:
    tool = SUBAGENTS_TOOL
    assert tool.name == "subagents" and tool.fanout and not tool.idempotent
    assert set(tool.parameters["properties"]) == {
        "tasks", "result_format", "model", "provider", "reasoning_effort", "tools"}
    assert tool.parameters["required"] == ["tasks"]
    assert not tool.external  # its result is Fermix-authored: never fenced
    with pytest.raises(AssertionError):
        tool.run(RunContext(), {"tasks": ["x"]})
    # Operators get it; guests (read_only) do not.
    registry = ToolRegistry([*BUILTIN_TOOLS, tool])
    assert registry.scoped(ToolScope("operator")).get("subagents") is tool
    assert registry.scoped(ToolScope("guest")).get("subagents") is None


def seed_number(phrase: str) -> int:
    """The number that ends one row of the seed's /ultra caps table."""
    return int(quoted("F", phrase).rsplit(" ", 1)[1])


def test_under_ultra_the_tool_advertises_the_seeds_wider_caps() -> None:
    tasks = seed_number("Max tasks per subagents call 50")
    at_once = seed_number("Max concurrency 12")
    registry = ToolRegistry([*BUILTIN_TOOLS, SUBAGENTS_TOOL]).scoped(ToolScope("operator"))

    def advertised(profile: RunProfile) -> ToolSpec:
        [spec] = [t for t in for_profile(registry, profile).specs() if t.name == "subagents"]
        return spec

    ultra, regular = advertised("ultra"), advertised("default")
    assert f"Up to {tasks} tasks per call, {at_once} at a time" in ultra.description
    assert ultra.parameters["properties"]["tasks"]["maxItems"] == tasks
    assert "Up to 10 tasks per call, 4 at a time" in regular.description
    assert regular.parameters["properties"]["tasks"]["maxItems"] == 10
    # Only the advertisement changes: the other tools, and a view without the tool, stay.
    assert [t.name for t in for_profile(registry, "ultra").specs()] == [
        t.name for t in registry.specs()]
    guest = ToolRegistry([*BUILTIN_TOOLS, SUBAGENTS_TOOL]).scoped(ToolScope("guest"))
    assert for_profile(guest, "ultra").get("subagents") is None


def test_arguments_are_checked_against_the_caps() -> None:
    args = parse_args({"tasks": [" a ", "b"]}, REGULAR, ultra=False)
    assert args.tasks == ["a", "b"] and args.result_format == "structured"
    assert parse_args({"tasks": ["x"] * 10}, REGULAR, ultra=False).tasks == ["x"] * 10
    with pytest.raises(ArgsError, match=r"too many tasks: 11 given, at most 10 per subagents call\."):
        parse_args({"tasks": ["x"] * 11}, REGULAR, ultra=False)
    assert len(parse_args({"tasks": ["x"] * 50}, ULTRA, ultra=True).tasks) == 50
    with pytest.raises(ArgsError, match="at most 50 per subagents call in /ultra mode"):
        parse_args({"tasks": ["x"] * 51}, ULTRA, ultra=True)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "tasks: Field required"),
        ({"tasks": []}, "tasks: List should have at least 1 item"),
        ({"tasks": ["ok", "  "]}, "every task must be a non-empty description"),
        ({"tasks": "one"}, "tasks: Input should be a valid list"),
        ({"tasks": ["a"], "result_format": "poem"}, "result_format: Input should be"),
        ({"tasks": ["a"], "provider": "acme"}, "provider: Input should be"),
        ({"tasks": ["a"], "timeout": 5}, "timeout: Extra inputs are not permitted"),
        ({"_unparsed": "{tasks"}, "tool arguments were not valid JSON"),
    ],
)
def test_bad_arguments_are_an_error_result(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgsError) as e:
        parse_args(arguments, REGULAR, ultra=False)
    assert str(e.value).startswith("Error: ") and message in str(e.value)


def test_a_guest_cannot_use_ultra() -> None:
    # HTTP callers are operators, so the refusal is the gateway's command handler's.
    key = ConversationKey(channel="telegram", chat_id="42")
    out = asyncio.run(handle(None, Settings(), key, Command("ultra", "dig"),  # type: ignore[arg-type]
                             Caller("telegram:7", "guest")))
    assert out.reply == "Sorry, /ultra is only available to the owner." and out.run_text is None
    owner = asyncio.run(handle(None, Settings(), key, Command("ultra", "dig"),  # type: ignore[arg-type]
                               Caller("telegram:1", "operator")))
    assert owner.run_text == "dig" and owner.profile == "ultra"


# --- prompts, tools and routes of a subagent ---------------------------------------------


def test_subagent_prompt_is_fixed_plus_the_format() -> None:
    assert "temporary subagent" in SUBAGENT_SYSTEM_PROMPT
    assert "no contact with the user" in SUBAGENT_SYSTEM_PROMPT
    assert "as few tool calls as you can" in SUBAGENT_SYSTEM_PROMPT
    for fmt, instruction in RESULT_FORMAT_INSTRUCTIONS.items():
        prompt = subagent_system_prompt(fmt)
        assert prompt.startswith(SUBAGENT_SYSTEM_PROMPT) and prompt.endswith(instruction)


def _tool(name: str, **kw: Any) -> Tool:
    return Tool(name, name, {"type": "object"}, lambda ctx, args: f"{name} ran", **kw)


def test_subagent_tools_drop_writes_gui_replies_memory_and_recursion() -> None:
    tools = [_tool("read"), _tool("write", policy="read_write"), _tool("gui", policy="gui_control"),
             _tool("shell", policy="exec"), _tool("fetch", policy="network"),
             _tool("react", delivers="reaction"), _tool("memory_recall"), SUBAGENTS_TOOL]
    sub = SubagentTools(tools, "operator")
    assert [s.name for s in sub.specs()] == ["read", "shell", "fetch"]
    nested = sub.execute(ToolCall(id="1", name="subagents", arguments={"tasks": ["x"]}),
                         RunContext())
    assert nested.is_error and nested.content == NESTED_CALL_ERROR
    assert NESTED_CALL_ERROR == "Error: subagents cannot be called from within a subagent"
    assert sub.get("subagents") is None  # so the loop never parks a subagent
    assert sub.execute(ToolCall(id="2", name="write"), RunContext()).is_error
    assert [s.name for s in SubagentTools(tools, "guest").specs()] == ["read"]


def test_subagent_tools_are_the_parent_s_and_a_per_call_list_only_narrows_them() -> None:
    # Issue 25: the parent's policy classes and tool list were not applied (the trust's
    # defaults were), so narrow agents fanned out subagents with network and MCP tools.
    mcp = _tool("srv__lookup", policy="external_api", source="mcp")
    tools = [_tool("read"), _tool("fetch", policy="network"), _tool("shell", policy="exec"),
             _tool("write", policy="read_write"), mcp, SUBAGENTS_TOOL]

    def names(**kw: Any) -> list[str]:
        return [s.name for s in SubagentTools(tools, "operator", **kw).specs()]

    assert names(parent_policies=["read_only", "exec", "read_write"]) == ["read", "shell"]
    assert names(parent_tools=["subagents", "read"]) == ["read"]
    assert names(parent_tools=["subagents", "read"], allowed_tools=["read", "fetch"]) == ["read"]
    assert names(allowed_tools=["fetch", "srv__lookup", "write"]) == ["fetch", "srv__lookup"]
    refused = SubagentTools(tools, "operator", parent_tools=["read"]).execute(
        ToolCall(id="1", name="fetch"), RunContext())
    assert refused.is_error and "not in this agent's allowed tools" in refused.content


def test_a_fan_out_carries_the_parent_s_limits_and_an_older_job_is_refused() -> None:
    fanout = CeleryFanOut(None, Settings())  # type: ignore[arg-type]
    scope = ToolScope("operator", allowed_tools=("subagents", "read"),
                      policies=frozenset({"read_only", "exec"}))
    req = FanOutRequest(run_id="run_p", conv="http|c|root", trust="operator",
                        profile="default", model="m", scope=scope,
                        call=ToolCall(id="c1", name="subagents",
                                      arguments={"tasks": ["a"], "tools": ["read", "fetch"]}))
    meta = FanOutMeta(fanout_id="f", conv=req.conv, run_id=req.run_id, call_id="c1")
    (job,) = fanout._subagent_jobs(req, REGULAR, meta)
    assert (job.parent_tools, job.parent_policies, job.allowed_tools) == (
        ["subagents", "read"], ["exec", "read_only"], ["read", "fetch"])
    # A job of the version before the parent's limits travelled would run with the trust's
    # defaults: it is refused (the header task reports it failed), never run wider.
    old = {k: v for k, v in job.model_dump(mode="json").items()
           if k not in ("parent_tools", "parent_policies")}
    with pytest.raises(ValueError, match="schema_version 2 is not 3; refusing"):
        SubagentJob.model_validate({**old, "schema_version": 2})
    report = crash_report(old, ValueError("SubagentJob schema_version 2 is not 3"), "w1")
    assert report.status == "failed" and report.index == 0


def test_routes_use_the_chain_unless_the_call_overrides_them() -> None:
    settings = Settings(provider="openai", model="gpt-main", provider_timeout=120)
    (route,) = subagent_routes(settings, None, None, 300)
    assert (route.provider, route.model, route.timeout) == ("openai", "gpt-main", 120)
    (route,) = subagent_routes(settings, None, None, 2)
    assert route.timeout == 2  # a silent provider cannot outlive the subagent
    (route,) = subagent_routes(settings, None, "gpt-small", 300)
    assert (route.name, route.provider, route.model) == ("openai/gpt-small", "openai", "gpt-small")
    (route,) = subagent_routes(settings, "anthropic", None, 300)
    assert (route.provider, route.model) == ("anthropic", "claude-sonnet-4-5")
    (route,) = subagent_routes(settings, "openai", None, 300)
    assert route.model == "gpt-main"


# --- results ----------------------------------------------------------------------------


def test_utf8_cut_never_splits_a_character() -> None:
    text = "aé€😀" * 50  # 1 + 2 + 3 + 4 bytes
    for limit in range(0, 60):
        cut, was_cut = cut_utf8(text, limit)
        assert was_cut and len(cut.encode()) <= limit and text.startswith(cut)
        assert limit - len(cut.encode()) < 4
    assert cut_utf8("short", 10) == ("short", False)
    assert cut_utf8("😀", 3) == ("", True)


def test_byte_shares_are_fair_and_pass_on_what_small_results_leave() -> None:
    assert byte_shares([10, 10, 10], 60) == [10, 10, 10]
    assert byte_shares([100, 100, 100], 60) == [20, 20, 20]
    assert byte_shares([5, 100, 1000], 60) == [5, 27, 27]
    assert sum(byte_shares([7, 90_000, 3, 40_000], 60_000)) <= 60_000
    assert byte_shares([], 60) == []


def report(i: int, status: str = "completed", text: str = "", **kw: Any) -> dict[str, Any]:
    field = "output" if status == "completed" else "error"
    return SubagentReport(index=i, status=status, **{field: text}, **kw).model_dump(mode="json")  # type: ignore[arg-type]


def test_merge_keeps_task_order_statuses_and_counts() -> None:
    tasks = ["find a", "find b", "find c", "find d", "find e"]
    raw = [report(3, "timed_out", "too slow"), report(0, text="A", started_at=1.0, ended_at=2.5),
           report(2, "cancelled", "stopped"), {"garbage": True}, report(1, "failed", "HTTP 400")]
    merged = normalize(raw, tasks)
    result = merge(tasks, merged, 60_000)
    doc = json.loads(result.content)
    assert doc["subagents"] == {"tasks": 5, "completed": 1, "failed": 2, "timed_out": 1,
                                "cancelled": 1}
    assert [e["task"] for e in doc["results"]] == [1, 2, 3, 4, 5]
    assert [e["status"] for e in doc["results"]] == [
        "completed", "failed", "cancelled", "timed_out", "failed"]
    assert doc["results"][0] == {"task": 1, "description": "find a", "status": "completed",
                                 "result": "A", "truncated": False, "seconds": 1.5}
    assert doc["results"][1]["error"] == "HTTP 400"
    assert doc["results"][4]["error"] == "no report came back"
    assert not result.is_error
    assert merge(tasks[:1], normalize([report(0, "failed", "x")], tasks[:1]), 100).is_error


def test_merge_cuts_each_result_to_its_share_and_flags_it() -> None:
    tasks = [f"t{i}" for i in range(10)]
    big = "ж" * 10_000  # 2 bytes a character: 20,000 bytes each
    merged = normalize([report(i, text=big if i % 2 else "small") for i in range(10)], tasks)
    doc = json.loads(merge(tasks, merged, 60_000).content)
    long = [e for e in doc["results"] if e["task"] % 2 == 0]  # tasks 2, 4, ... are indexes 1, 3
    assert all(e["truncated"] for e in long)
    assert all(not e["truncated"] and e["result"] == "small" for e in doc["results"]
               if e["task"] % 2)
    total = sum(len(e["result"].encode()) for e in doc["results"])
    assert 59_900 <= total <= 60_000
    assert all(set(e["result"]) == {"ж"} for e in long)  # cut on a character boundary
    ultra = json.loads(merge(tasks, merged, 300_000).content)
    assert not any(e["truncated"] for e in ultra["results"])


def test_a_long_task_description_is_echoed_cut() -> None:
    desc = "ü" * 500
    doc = json.loads(merge([desc], normalize([report(0, text="ok")], [desc]), 100).content)
    assert doc["results"][0]["description"] == "ü" * 100 + "…"
