"""Approvals on real processes: a gateway and ONE worker of concurrency 1, with calculator
calls needing approval. A turn waiting for its answer holds no worker slot (another
conversation's turn runs meanwhile); approving it over HTTP resumes it and it answers once,
also when the worker that parked it was killed while it waited."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, terminal_events, turn_calls, uniq, wait


@pytest.fixture(scope="module")
def fleet(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_APPROVALS__POLICIES": "[]",
           "FERMIX_APPROVALS__TOOLS": '["calculator"]'}
    s = start_stack("approvals", redis_url, 13, env, logs_dir, workers=0)
    try:
        s.start_worker("approvals-w1", concurrency=1)
        yield s
    finally:
        s.stop()


def script_calculation(llm: ScriptedLLMServer, task: str) -> None:
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=task),
        Reply(text=f"42, as approved: {task}", match=task),
    )


def waiting_approval(http: httpx.Client, run_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def listed() -> bool:
        found[:] = [a for a in http.get("/v1/approvals").json()["approvals"]
                    if a["runId"] == run_id]
        return bool(found)

    wait_until(listed, 30, f"an approval for {run_id}")
    return found[0]


def tool_results(llm: ScriptedLLMServer, task: str) -> list[str]:
    last = [q for q in turn_calls(llm.script.requests) if task in json.dumps(q["body"])][-1]
    return [m["content"] for m in last["body"]["messages"] if m["role"] == "tool"]


def test_a_waiting_turn_holds_no_slot_and_approval_resumes_it_once(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    task, other = uniq("calc"), uniq("other")
    script_calculation(llm, task)
    llm.script.push(Reply(text="meanwhile", match=other))
    with fleet.http() as http:
        run_id = start(http, task, uniq("chat"))
        ask = waiting_approval(http, run_id)
        assert (ask["tool"], ask["arguments"], ask["status"]) == (
            "calculator", {"expression": "6*7"}, "pending")
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "running"
        # The only slot is free: another conversation's turn runs to its end meanwhile.
        assert wait(http, start(http, other, uniq("chat")))["reply"] == "meanwhile"
        answer = http.post(f"/v1/approvals/{ask['id']}", json={"decision": "approve"})
        assert answer.status_code == 200 and answer.json()["status"] == "approved"
        again = http.post(f"/v1/approvals/{ask['id']}", json={"decision": "deny"})
        assert again.status_code == 409 and "already answered: approved by http:api" in (
            again.json()["error"])
        done = wait(http, run_id)
        assert done["status"] == "ok" and done["reply"] == f"42, as approved: {task}"
    assert tool_results(llm, task) == ["6*7 = 42"]
    assert len(terminal_events(fleet.redis(), run_id)) == 1


def test_approval_resumes_the_turn_after_its_worker_was_killed(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    task = uniq("calc")
    script_calculation(llm, task)
    with fleet.http() as http:
        run_id = start(http, task, uniq("chat"))
        ask = waiting_approval(http, run_id)
        victim = fleet.kill_holder(http, run_id)
        fleet.start_worker("approvals-w2", concurrency=1)
        answer = http.post(f"/v1/approvals/{ask['id']}", json={"decision": "approve"})
        assert answer.status_code == 200
        done = wait(http, run_id)
        assert done["status"] == "ok" and done["reply"] == f"42, as approved: {task}"
        assert done["worker"].split("@")[0] == "approvals-w2" != victim.name
    assert tool_results(llm, task) == ["6*7 = 42"]
    assert len(terminal_events(fleet.redis(), run_id)) == 1


def test_an_operator_denies_and_bad_answers_get_reasons(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    task = uniq("calc")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=task),
        Reply(text="Understood, not calculating.", match=task),
    )
    with fleet.http() as http:
        run_id = start(http, task, uniq("chat"))
        ask = waiting_approval(http, run_id)
        assert http.post("/v1/approvals/zzzzzzzz", json={"decision": "approve"}).status_code == 404
        assert http.post(f"/v1/approvals/{ask['id']}", json={"decision": "maybe"}).status_code == 422
        denied = http.post(f"/v1/approvals/{ask['id']}",
                           json={"decision": "deny", "reason": "too risky"})
        assert denied.status_code == 200 and denied.json()["reason"] == "too risky"
        assert wait(http, run_id)["reply"] == "Understood, not calculating."
    (result,) = tool_results(llm, task)
    assert result.startswith("Error: this call was not approved (denied by http:api: too risky)")
