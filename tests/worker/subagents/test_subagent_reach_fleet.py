"""What a subagent can reach, on real processes: a gateway and ONE ``celery worker`` of
concurrency 1 with a workspace, a skill on disk and the default ``[approvals]`` (every
``exec`` call waits for a person). Subagents read the parent turn's workspace and write none of
it; run sandboxed commands that see it read-only, after an approval that parks the subagent's
job, not the parent (the only worker slot stays free meanwhile, and /stop withdraws the
question); and run a skill inline, which cannot run skill_run again (issue 27, item 7)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.skills import render_skill
from fermix_worker.tools.sandbox import Unavailable, forget_probe, plan
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, terminal_events, uniq, wait
from tests.seed_text import quoted

pytestmark = pytest.mark.fleet

SEED = quoted("F", "Workers can read files, fetch from the web, use MCP and plugin tools, and "
                   "run skills and sandbox-bounded shell commands")
NOTES = "the build target is fermix-7\n"
DIGEST = render_skill("digest", "Digest the workspace notes.", "1. Read notes.txt.\n2. Digest it.",
                      ["read_file", "skill_run", "current_time"])


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    ws = tmp_path_factory.mktemp("reach-ws")
    (ws / "notes.txt").write_text(NOTES)
    skill = logs_dir / "subagent-reach" / "skills" / "digest" / "SKILL.md"
    skill.parent.mkdir(parents=True, exist_ok=True)
    skill.write_text(DIGEST)
    env = {**provider_env(llm, "openai"), "FERMIX_WORKSPACE": str(ws)}
    s = start_stack("subagent-reach", redis_url, 8, env, logs_dir, workers=0)
    try:
        s.start_worker("subagent-reach-w1", concurrency=1)
        yield s, ws
    finally:
        s.stop()


def fan_out(llm: ScriptedLLMServer, user: str, tasks: list[str], *subagent: Reply) -> None:
    """The parent fans ``tasks`` out, the subagents' replies follow, then it synthesizes."""
    llm.script.push(Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks})], match=user),
                    *subagent, Reply(text=f"synthesized {user}", match=user))


def bodies(llm: ScriptedLLMServer, last: str) -> list[dict[str, Any]]:
    """The model requests whose last user message is ``last``."""
    return [q["body"] for q in llm.script.requests
            if [m for m in q["body"]["messages"] if m["role"] == "user"][-1]["content"] == last]


def offered(body: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in body.get("tools") or [])


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def approvals_of(http: httpx.Client, run_id: str, count: int = 1) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def listed() -> bool:
        found[:] = [a for a in http.get("/v1/approvals").json()["approvals"]
                    if a["runId"] == run_id]
        return len(found) >= count

    wait_until(listed, 30, f"{count} approvals for {run_id}")
    return found


def test_a_subagent_reads_the_parent_turn_s_workspace_and_writes_nothing(
    stack: tuple[Stack, Path], llm: ScriptedLLMServer
) -> None:
    assert "read files" in SEED
    s, ws = stack
    user, task = uniq("reader"), uniq("read-notes")
    fan_out(llm, user, [task],
            Reply(tool_calls=[ToolCallSpec("read_file", {"path": "notes.txt"}),
                              ToolCallSpec("write_file", {"path": "notes.txt", "content": "x"})],
                  match=task),
            Reply(text="the target is fermix-7", match=task))
    with s.http() as http:
        done = wait(http, start(http, user, uniq("chat")), timeout=60)
    assert done["status"] == "ok" and done["reply"] == f"synthesized {user}"
    first, second = bodies(llm, task)
    names = offered(first)
    assert {"read_file", "list_files", "search_files", "run_command"} <= set(names), names
    assert not {"write_file", "edit_file"} & set(names)
    read, write = tool_results(second)
    assert "fermix-7" in read
    assert write == ("Error: tool 'write_file' is not available here (needs read_write access; "
                     "caller is operator).")
    assert (ws / "notes.txt").read_text() == NOTES


def test_a_subagent_s_command_parks_its_job_for_approval_then_runs_sandboxed(
    stack: tuple[Stack, Path], llm: ScriptedLLMServer
) -> None:
    assert "sandbox-bounded shell commands" in SEED
    forget_probe()
    if isinstance(found := plan("auto"), Unavailable):
        pytest.skip(found.reason)
    s, ws = stack
    user, task, other = uniq("runner"), uniq("run-cmd"), uniq("meanwhile")
    command = "cat notes.txt; (echo changed > notes.txt) 2>/dev/null || echo read-only; echo $HOME"
    fan_out(llm, user, [task],
            Reply(tool_calls=[ToolCallSpec("run_command", {"command": command})], match=task),
            Reply(text="the command ran", match=task))
    llm.script.push(Reply(text="meanwhile answered", match=other))
    with s.http() as http:
        run_id = start(http, user, uniq("chat"))
        (ask,) = approvals_of(http, run_id)
        assert (ask["tool"], ask["arguments"], ask["status"]) == (
            "run_command", {"command": command}, "pending")
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "running"
        # Neither the parked parent nor the parked subagent holds the only worker slot.
        assert wait(http, start(http, other, uniq("chat")))["reply"] == "meanwhile answered"
        answer = http.post(f"/v1/approvals/{ask['id']}", json={"decision": "approve"})
        assert answer.status_code == 200, answer.text
        done = wait(http, run_id, timeout=60)
    assert done["status"] == "ok" and done["reply"] == f"synthesized {user}"
    (result,) = tool_results(bodies(llm, task)[-1])
    assert result.startswith("exit code 0"), result
    assert "fermix-7" in result and "read-only" in result and "/tmp" in result
    assert (ws / "notes.txt").read_text() == NOTES  # the sandbox showed the workspace read-only
    assert len(terminal_events(s.redis(), run_id)) == 1


def test_stop_of_the_parent_withdraws_its_parked_subagents_approvals(
    stack: tuple[Stack, Path], llm: ScriptedLLMServer
) -> None:
    s, _ = stack
    user, chat = uniq("stopper"), uniq("chat")
    tasks = [uniq("wait-a"), uniq("wait-b")]
    fan_out(llm, user, tasks, *[
        Reply(tool_calls=[ToolCallSpec("run_command", {"command": f"echo {t}"})], match=t)
        for t in tasks])
    with s.http() as http:
        run_id = start(http, user, chat)
        asks = approvals_of(http, run_id, count=2)
        assert wait(http, start(http, "/stop", chat))["status"] == "ok"
        assert wait(http, run_id, timeout=15)["status"] == "stopped"
        wait_until(lambda: not [a for a in http.get("/v1/approvals").json()["approvals"]
                                if a["runId"] == run_id], 10, "the approvals withdrawn")
        statuses = [http.get(f"/v1/approvals/{a['id']}").json()["status"] for a in asks]
    assert statuses == ["cancelled", "cancelled"]
    assert all(len(bodies(llm, t)) == 1 for t in tasks)  # no subagent went on


def test_a_subagent_runs_a_skill_inline_and_the_skill_cannot_run_skills(
    stack: tuple[Stack, Path], llm: ScriptedLLMServer
) -> None:
    assert "run skills" in SEED
    s, _ = stack
    user, task, skill_task = uniq("skiller"), uniq("use-skill"), uniq("digest-notes")
    fan_out(llm, user, [task],
            Reply(tool_calls=[ToolCallSpec("skill_run", {"name": "digest", "task": skill_task})],
                  match=task),
            Reply(tool_calls=[ToolCallSpec("read_file", {"path": "notes.txt"}),
                              ToolCallSpec("skill_run", {"name": "digest", "task": "again"})],
                  match=skill_task),
            Reply(text="digest: target fermix-7", match=skill_task),
            Reply(text="the skill says fermix-7", match=task))
    with s.http() as http:
        done = wait(http, start(http, user, uniq("chat")), timeout=60)
    assert done["status"] == "ok" and done["reply"] == f"synthesized {user}"
    assert "skill_run" in offered(bodies(llm, task)[0])
    first, second = bodies(llm, skill_task)
    assert first["messages"][0]["content"].startswith(
        "1. Read notes.txt.\n2. Digest it.\n\nYou are running the skill 'digest'")
    assert offered(first) == ["current_time", "read_file"]  # no skill_run inside a skill
    read, nested = tool_results(second)
    assert "fermix-7" in read
    assert nested == "Error: skill_run cannot be called from within a subagent or a skill run"
    assert tool_results(bodies(llm, task)[-1]) == ["digest: target fermix-7"]
