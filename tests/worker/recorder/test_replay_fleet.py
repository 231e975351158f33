"""Replay and fork through real parts: a uvicorn gateway, a real ``celery worker``, Redis, and
the scripted model reached through the official OpenAI SDK. A 5-step tool turn (model,
calculator, model, calculator, model) is recorded as it runs; its replay reproduces it with no
model called; after the system prompt changes, the replay names step 1 and the difference; a
fork from step 3 onto a second model answers in a scratch conversation and is shown beside
the original."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.procs import stop_all
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from tests.cli.terminal import clean_env, plain
from tests.cli.terminal import fermix as fermix_on
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import turn_calls, uniq, wait

PROMPT = "You are Fermix, a careful calculator. Show your working."


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_SYSTEM_PROMPT": PROMPT,
           "FERMIX_USAGE__ENABLED": "true"}
    s = start_stack("replay", redis_url, 9, env, logs_dir)
    yield s
    s.stop()


def five_step_turn(stack: Stack, llm: ScriptedLLMServer) -> tuple[str, str]:
    """A turn of 5 steps (model, tool, model, tool, model); its text and run id."""
    text = uniq("sums")
    llm.script.push(
        Reply(match=text, tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
        Reply(match=text, tool_calls=[ToolCallSpec("calculator", {"expression": "42+1"})]),
        Reply(match=text, text="6*7 is 42, and one more is 43."),
    )
    with stack.http() as http:
        resp = http.post("/v1/agent", json={"message": text, "chatId": uniq("chat")})
        assert resp.status_code == 202, resp.text
        run = wait(http, resp.json()["runId"])
    assert run["status"] == "ok", run
    assert run["reply"] == "6*7 is 42, and one more is 43."
    return text, run["runId"]


def test_a_replay_reproduces_a_five_step_tool_turn_without_calling_anything(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    text, run_id = five_step_turn(stack, llm)
    called = len(llm.script.requests)
    with stack.http() as http:
        record = http.get(f"/v1/runs/{run_id}/record").json()
        assert record["entries"] >= 7 and record["bytes"] > 0  # start, 3 calls, 2 tools, end
        resp = http.post(f"/v1/runs/{run_id}/replay", json={}, timeout=90)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["reproduced"] is True, body
    assert body["divergence"] is None
    assert [s["kind"] for s in body["steps"]] == ["model", "tool", "model", "tool", "model"]
    assert body["steps"][1]["summary"] == "calculator → ok (8 characters)"
    assert body["reply"] == body["recordedReply"] == "6*7 is 42, and one more is 43."
    # The CLI says so, exits 0, and --step shows a step as recorded.
    out = stack.fermix("replay", run_id)
    assert out.returncode == 0, out.stderr
    assert "Reproduced: the same tool calls and the same reply (30 bytes" in out.stdout
    assert "  2  tool   calculator → ok (8 characters)" in out.stdout
    # On a terminal: the steps as a table, the verdict in green.
    shown = fermix_on(_terminal(stack), "replay", run_id, tty="stdout")
    assert shown.returncode == 0
    assert ["STEP", "KIND", "SUMMARY"] in [line.split() for line in plain(shown.stdout).splitlines()]
    assert ["2", "tool", "calculator", "→", "ok", "(8", "characters)"] in [
        line.split() for line in plain(shown.stdout).splitlines()]
    assert "\x1b[1;32mReproduced: the same tool calls" in shown.stdout
    step = stack.fermix("replay", run_id, "--step", "3", "--json")
    assert step.returncode == 0, step.stderr
    detail = json.loads(step.stdout)["detail"]
    assert detail["kind"] == "model"
    assert detail["response"]["tool_calls"][0]["arguments"] == {"expression": "42+1"}
    assert detail["request"]["messages"][-1]["content"] == "6*7 = 42"
    assert detail["request"]["system"].startswith(PROMPT)
    # No model was called by any of it.
    assert len(llm.script.requests) == called
    missing = stack.fermix("replay", "run_nothing")
    assert missing.returncode == 1
    assert "run run_nothing has no record" in missing.stderr


def test_after_a_prompt_change_the_replay_names_the_first_step_that_diverges(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    _, run_id = five_step_turn(stack, llm)
    # The operator edits the prompt and restarts the worker.
    stop_all(stack.workers, grace=10)
    stack.procs = [p for p in stack.procs if p not in stack.workers]
    stack.workers.clear()
    stack.env["FERMIX_SYSTEM_PROMPT"] = PROMPT.replace("careful", "quick")
    stack.start_worker("replay-w2")
    out = stack.fermix("replay", run_id)
    assert out.returncode == 1, out.stdout
    assert "Diverged at step 1 (model): the system prompt differs at character 19." in out.stdout
    assert "recorded: You are Fermix, a careful calculator. Show your working.\\n\\n" in out.stdout
    assert "now:      You are Fermix, a quick calculator. Show your working.\\n\\n" in out.stdout


def test_a_fork_onto_a_second_model_answers_beside_the_original(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    text, run_id = five_step_turn(stack, llm)
    llm.script.push(Reply(match=text, text="Model B: 42, then 43."))
    before = len(llm.script.requests)
    with stack.http() as http:
        resp = http.post(f"/v1/runs/{run_id}/fork", json={"step": 3, "model": "scripted-b"},
                         timeout=120)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        fork_id = body["fork"]["runId"]
        fork_run = http.get(f"/v1/runs/{fork_id}").json()
        bad = http.post(f"/v1/runs/{run_id}/fork", json={"step": 9, "model": "scripted-b"})
    original, fork = body["original"], body["fork"]
    assert original["reply"] == "6*7 is 42, and one more is 43."
    assert [c["arguments"] for c in original["toolCalls"]] == [{"expression": "42+1"}]
    assert fork["reply"] == "Model B: 42, then 43."
    assert fork["label"] == "model openai/scripted-b" and fork["toolCalls"] == []
    assert fork["inputTokens"] > 0 and fork["outputTokens"] > 0
    # One model call, to the second model, with the first two steps as recorded.
    calls = turn_calls(llm.script.requests[before:])
    assert [c["body"]["model"] for c in calls] == ["scripted-b"]
    sent = calls[0]["body"]["messages"]
    assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "tool"]
    assert sent[-1]["content"] == "6*7 = 42"
    # The fork is a run of its own, in a scratch conversation; nothing reached the chat.
    assert fork_run["status"] == "ok" and fork_run["reply"] == "Model B: 42, then 43."
    assert fork_run["conversation"]["chatId"] == f"fork:{run_id}"
    assert bad.status_code == 422
    assert "the run ended at step 5; fork from step 5 or before" in bad.json()["error"]
    # On a terminal: the two side by side as a table, then the replies.
    llm.script.push(Reply(match=text, text="Model B again: 43."))
    shown = fermix_on(_terminal(stack), "fork", run_id, "--step", "3", "--model", "scripted-b",
                      tty="stdout")
    assert shown.returncode == 0
    rows = [line.split() for line in plain(shown.stdout).splitlines()]
    assert ["status", "ok", "ok"] in rows and ["reply", "(fork):"] in rows
    assert rows[rows.index(["reply", "(fork):"]) + 1] == ["Model", "B", "again:", "43."]


def _terminal(stack: Stack) -> dict[str, str]:
    """The stack's environment for a ``fermix`` on a terminal (tests/cli/terminal.py)."""
    return clean_env(stack.env, FERMIX_GATEWAY_URL=stack.url)
