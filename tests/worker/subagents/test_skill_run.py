"""``skill_run`` without worker processes: what a name resolves to and at which trust, the
refusals the model reads, the job a run gets, what the run's model is offered (a plugin skill
asking for ``exec`` and ``read_write`` gets read_only tools only: real Redis, the scripted LLM,
SubagentRunner in-process) and the result the caller reads."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.messages import ToolCall
from fermix_shared.models import Trust
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry, render_skill
from fermix_worker.approvals.policy import SUBAGENT_REFUSAL
from fermix_worker.subagents.caps import QUEUE_SLACK_S, REGULAR
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.subagents.fanout import CeleryFanOut, FanOutMeta
from fermix_worker.subagents.registry import SubagentTools
from fermix_worker.subagents.results import Status, SubagentReport
from fermix_worker.subagents.runner import SubagentJob, SubagentRunner, job_tools
from fermix_worker.subagents.skill_run import skill_result
from fermix_worker.subagents.skill_tool import SKILL_RUN_TOOL
from fermix_worker.subagents.tool import ArgsError
from fermix_worker.tools import BUILTIN_TOOLS, RunContext, Tool, ToolRegistry, ToolScope
from fermix_worker.tools.skills import skill_tools

# A plugin's skill (guest) whose frontmatter asks for far more than a guest may have.
GREEDY_PLUGIN = """---
name: greedy
description: A plugin skill that wants everything.
allowed_tools: [skill_create, shell_run, current_time]
policy: [exec, read_write, read_only]
---
Plugin steps: run shell_run, then skill_create.
"""
SHELL = Tool("shell_run", "Run a shell command.", {"type": "object"}, lambda ctx, a: "ran",
             policy="exec")


@pytest.fixture
def registry(r: redis.Redis, tmp_path: Path) -> SkillRegistry:
    plugin = tmp_path / "plugins" / "p" / "skills" / "greedy" / "SKILL.md"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(GREEDY_PLUGIN)
    reg = SkillRegistry(r, tmp_path)
    reg.create(render_skill("digest", "Summarise a text.", "1. Read.\n2. Summarise.",
                            ["current_time", "shell_run", "skill_create"], "digest-model"))
    return reg


def fan(registry: SkillRegistry, *agents: AgentDefinition) -> CeleryFanOut:
    settings = Settings(agents=list(agents), subagent_timeout_seconds=300)
    return CeleryFanOut(None, settings, lambda: registry)


def request(arguments: dict[str, Any], trust: Trust = "operator", agent: str = "default",
            conv: str = "http|c|root", scope: ToolScope | None = None) -> FanOutRequest:
    return FanOutRequest(run_id="run_p", conv=conv, trust=trust, profile="default",
                         model="parent-model", scope=scope or ToolScope(trust), agent=agent,
                         call=ToolCall(id="call1", name="skill_run", arguments=arguments))


def plan(fanout: CeleryFanOut, req: FanOutRequest) -> tuple[SubagentJob, FanOutMeta]:
    meta = FanOutMeta(fanout_id=uuid.uuid4().hex, conv=req.conv, run_id=req.run_id,
                      call_id=req.call.id, tool="skill_run")
    return fanout.plan_skill_run(req, REGULAR, meta), meta


def refusal(fanout: CeleryFanOut, req: FanOutRequest) -> str:
    with pytest.raises(ArgsError) as e:
        plan(fanout, req)
    return str(e.value)


# --- the tool ----------------------------------------------------------------------------


def test_the_tool_parks_is_open_to_guests_and_never_offered_inside_a_run() -> None:
    tool = SKILL_RUN_TOOL
    assert (tool.name, tool.fanout, tool.policy, tool.idempotent) == (
        "skill_run", True, "read_only", False)
    assert tool.parameters["required"] == ["name", "task"] and not tool.external
    registry = ToolRegistry([*BUILTIN_TOOLS, tool])
    assert registry.scoped(ToolScope("guest")).get("skill_run") is tool
    sub = SubagentTools([*BUILTIN_TOOLS, tool], "operator")
    assert sub.get("skill_run") is None  # so a skill run never parks
    nested = sub.execute(ToolCall(id="1", name="skill_run", arguments={"name": "x", "task": "y"}),
                         RunContext())
    assert nested.is_error and nested.content == (
        "Error: skill_run cannot be called from within a subagent or a skill run")
    fanout = CeleryFanOut(None, Settings())
    assert fanout.deadline(ToolCall(id="c", name="skill_run", arguments={}), "default") == (
        REGULAR.park_s(1))


# --- what a name resolves to, and the refusals ---------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"name": "digest"}, "Error: invalid skill_run arguments: task: Field required"),
        ({"name": " ", "task": "t"}, "Error: invalid skill_run arguments: name: Value error, "
                                     "must not be empty"),
        ({"name": "digest", "task": "t", "model": "x"},
         "Error: invalid skill_run arguments: model: Extra inputs are not permitted"),
        ({"_unparsed": "{name"}, "Error: tool arguments were not valid JSON"),
        ({"name": "nope", "task": "t"},
         "Error: no skill named 'nope'; skill_list shows the available ones"),
    ],
)
def test_bad_calls_are_refused_with_the_error_the_model_reads(
    registry: SkillRegistry, arguments: dict[str, Any], message: str
) -> None:
    assert refusal(fan(registry), request(arguments)) == message


def test_guests_cannot_run_operator_skills_and_delegates_bound_every_caller(
    registry: SkillRegistry
) -> None:
    task = {"name": "digest", "task": "t"}
    assert refusal(fan(registry), request(task, trust="guest")) == (
        "Error: no skill named 'digest'; skill_list shows the available ones")
    # An operator caller answered by a guest agent runs as a guest, too.
    guest_agent = AgentDefinition(name="front", trust="guest")
    assert "no skill named 'digest'" in refusal(fan(registry, guest_agent),
                                                request(task, agent="front"))
    narrow = AgentDefinition(name="narrow", delegates=["greedy"])
    assert refusal(fan(registry, narrow), request(task, agent="narrow")) == (
        "Error: agent 'narrow' may not run 'digest' (the skills and agents it may run: greedy)")
    none = AgentDefinition(name="none", delegates=[])
    assert refusal(fan(registry, none), request(task, agent="none")).endswith(
        "(the skills and agents it may run: none)")
    job, _ = plan(fan(registry, narrow), request({"name": "greedy", "task": "t"}, agent="narrow"))
    assert job.skill == "greedy"


def test_an_operator_skill_runs_at_the_callers_trust_with_its_own_prompt_tools_and_model(
    registry: SkillRegistry
) -> None:
    before = time.time()
    job, meta = plan(fan(registry), request({"name": "digest", "task": " sum this "}))
    assert (job.skill, job.task, job.trust, job.model, job.provider) == (
        "digest", "sum this", "operator", "digest-model", None)
    assert job.system is not None and job.system.startswith("1. Read.\n2. Summarise.\n\n")
    assert "You are running the skill 'digest' for another agent" in job.system
    assert job.allowed_tools == ["current_time", "shell_run", "skill_create"]
    assert job.policies is None and job.max_iterations == REGULAR.max_iterations
    assert (job.index, job.concurrency, job.timeout_s) == (0, 1, REGULAR.timeout_s)
    assert job.deadline_at == pytest.approx(before + REGULAR.timeout_s + QUEUE_SLACK_S, abs=2)
    assert (meta.skill, meta.fenced, meta.tasks, meta.result_bytes) == (
        "digest", False, ["sum this"], REGULAR.result_bytes)
    # The job crosses to any worker: it carries everything, and round-trips.
    assert SubagentJob.model_validate(json.loads(job.model_dump_json())) == job


def test_a_plugin_skill_runs_as_a_guest_and_its_answer_is_fenced(
    registry: SkillRegistry
) -> None:
    for trust in ("operator", "guest"):
        job, meta = plan(fan(registry), request({"name": "greedy", "task": "t"}, trust=trust))
        assert job.trust == "guest" and meta.fenced
        assert job.policies == ["exec", "read_only", "read_write"]  # the runner narrows them


def test_a_sub_agent_is_a_target_within_the_caps_and_the_callers_policy(
    registry: SkillRegistry
) -> None:
    researcher = AgentDefinition(
        name="researcher", role="sub", system_prompt="You research.", provider="anthropic",
        model="claude-x", reasoning_effort="high", temperature=0.2, allowed_tools=["http_fetch"],
        policy=["network", "exec"], trust="operator", max_iterations=7, timeout_seconds=5000)
    careful = AgentDefinition(name="careful", policy=["read_only", "network"])
    fanout = fan(registry, researcher, careful)
    job, meta = plan(fanout, request({"name": "researcher", "task": "t"}, agent="careful"))
    assert (job.skill, job.trust, job.provider, job.model, job.reasoning_effort) == (
        "researcher", "operator", "anthropic", "claude-x", "high")
    assert job.system is not None and job.system.startswith("You research.\n\n")
    assert "the agent 'researcher'" in job.system
    assert (job.allowed_tools, job.policies) == (["http_fetch"], ["network"])
    assert (job.max_iterations, job.timeout_s) == (7, REGULAR.timeout_s)  # capped
    assert job.temperature == 0.2
    assert not meta.fenced
    guest, _ = plan(fanout, request({"name": "researcher", "task": "t"}, trust="guest"))
    assert guest.trust == "guest"
    main = AgentDefinition(name="helper", role="main")
    assert "no skill named 'helper'" in refusal(
        fan(registry, main), request({"name": "helper", "task": "t"}))


def test_a_skill_run_gets_no_tool_its_calling_turn_lacks(registry: SkillRegistry) -> None:
    # Issue 25: the run was bounded by the skill's list and trust only, so an agent limited
    # to `allowed_tools = ["skill_run"]` ran skills with tools it was never given.
    tools = [*BUILTIN_TOOLS, *skill_tools(lambda: registry), SHELL]
    task = {"name": "digest", "task": "t"}  # the skill lists current_time, shell_run, skill_create

    def names(scope: ToolScope) -> list[str]:
        job, _ = plan(fan(registry), request(task, scope=scope))
        # The limits travel in the job (they cross to another worker).
        job = SubagentJob.model_validate(json.loads(job.model_dump_json()))
        return sorted(s.name for s in job_tools(job, tools).specs())

    assert names(ToolScope("operator")) == ["current_time", "shell_run"]
    assert names(ToolScope("operator", allowed_tools=("skill_run", "shell_run"))) == ["shell_run"]
    assert names(ToolScope("operator", policies=frozenset({"read_only"}))) == ["current_time"]
    assert names(ToolScope("operator", allowed_tools=("skill_run",))) == []


# --- the run, in-process: what its model is offered -------------------------------------


@pytest.fixture
def runner(r: redis.Redis, llm: ScriptedLLMServer, registry: SkillRegistry,
           monkeypatch: pytest.MonkeyPatch) -> SubagentRunner:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    # No approvals: exec tools are offered to subagents (see the test of approvals below).
    settings = Settings(provider="openai", model="scripted-openai", cancel_poll_seconds=0.05,
                        approvals={"policies": []})
    tools = [*BUILTIN_TOOLS, *skill_tools(lambda: registry), SHELL, SKILL_RUN_TOOL]
    return SubagentRunner(r, settings, tools)


def parked_parent(r: redis.Redis) -> str:
    conv = f"http|{uuid.uuid4().hex}|root"
    r.hset(keys.active(conv), mapping={"turn_id": "run_p", "worker": "parked:run_p"})
    r.expire(keys.active(conv), 60)
    return conv


def run_skill(r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner,
              registry: SkillRegistry, name: str, trust: Trust,
              calls: list[ToolCallSpec]) -> tuple[SubagentReport, list[dict[str, Any]]]:
    """Run skill ``name`` for a caller of ``trust``: its model makes ``calls``, then answers.
    The report and the run's model requests."""
    task = f"task-{uuid.uuid4().hex[:8]}"
    llm.script.push(Reply(tool_calls=calls, match=task), Reply(text=f"answer {task}", match=task))
    job, _ = plan(fan(registry), request({"name": name, "task": task}, trust=trust,
                                         conv=parked_parent(r)))
    report = runner.run(job, "w1")
    assert isinstance(report, SubagentReport)
    bodies = [q["body"] for q in llm.script.requests if task in json.dumps(q["body"])]
    return report, bodies


def offered(body: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in body.get("tools", []))


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_a_plugin_skill_asking_for_exec_and_read_write_gets_read_only_tools(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner, registry: SkillRegistry
) -> None:
    calls = [ToolCallSpec("shell_run", {}), ToolCallSpec("skill_create", {
        "name": "x", "description": "d", "instructions": "i"}), ToolCallSpec("current_time", {})]
    report, (first, second) = run_skill(r, llm, runner, registry, "greedy", "operator", calls)
    assert report.status == "completed" and report.output.startswith("answer task-")
    assert first["messages"][0]["content"].startswith(
        "Plugin steps: run shell_run, then skill_create.\n\nYou are running the skill 'greedy'")
    assert offered(first) == ["current_time"]
    shell, create, clock = tool_results(second)
    assert shell == "Error: tool 'shell_run' is not available here (needs exec access; caller is guest)."
    assert create == ("Error: tool 'skill_create' is not available here "
                      "(needs read_write access; caller is guest).")
    assert not clock.startswith("Error")
    assert "x" not in registry.current().skills  # nothing was created


def test_an_operator_skill_gets_its_listed_tools_minus_what_no_subagent_gets(
    r: redis.Redis, llm: ScriptedLLMServer, runner: SubagentRunner, registry: SkillRegistry
) -> None:
    report, (first, second) = run_skill(r, llm, runner, registry, "digest", "operator",
                                        [ToolCallSpec("shell_run", {})])
    assert report.status == "completed"
    # Its list names skill_create too, but a subagent never writes local state.
    assert offered(first) == ["current_time", "shell_run"]
    assert tool_results(second) == ["ran"]


def test_a_skill_run_that_cannot_park_is_never_offered_tools_that_wait_for_approval(
    r: redis.Redis, llm: ScriptedLLMServer, registry: SkillRegistry,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    settings = Settings(provider="openai", model="scripted-openai", cancel_poll_seconds=0.05)
    gated = SubagentRunner(r, settings, [*BUILTIN_TOOLS, SHELL, SKILL_RUN_TOOL])
    # Run without a claim (nowhere to park: test_subagent_park.py has the claimed runs, which
    # park their job for the approval instead).
    report, (first, second) = run_skill(r, llm, gated, registry, "digest", "operator",
                                        [ToolCallSpec("shell_run", {})])
    assert report.status == "completed"
    assert offered(first) == ["current_time"]  # exec needs approval by default
    assert tool_results(second) == [SUBAGENT_REFUSAL.format(tool="shell_run")]


# --- the result the caller reads ----------------------------------------------------------


def test_the_result_is_the_answer_capped_and_fenced_or_the_reason() -> None:
    done = SubagentReport(index=0, status="completed", output="é" * 10)
    assert skill_result("digest", done, 100, fenced=False).content == "é" * 10
    cut = skill_result("digest", done, 5, fenced=False)
    assert cut.content == "éé\n[truncated]" and not cut.is_error
    fenced = skill_result("greedy", done, 100, fenced=True).content
    assert fenced.startswith('<untrusted_tool_result tool="skill_run">') and "é" * 10 in fenced
    failures: list[tuple[Status, str]] = [
        ("failed", "failed"), ("timed_out", "timed out"), ("cancelled", "was cancelled")]
    for status, text in failures:
        out = skill_result("digest", SubagentReport(index=0, status=status, error="why"), 100,
                           fenced=True)
        assert out.is_error and out.content == f"Error: skill 'digest' {text}: why"
