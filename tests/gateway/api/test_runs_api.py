"""End to end on real parts: uvicorn gateway, real `celery worker`, real Redis, the scripted
LLM reached through the official openai and anthropic SDKs (streaming)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fermix_dev.procs import free_port
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Disconnect, Reply, ToolCallSpec
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import turn_calls
from tests.seed_text import quoted


def uniq(prefix: str = "msg") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run_turn(http: httpx.Client, message: str, chat: str, timeout: float = 30,
             **extra: object) -> dict:
    resp = http.post("/v1/agent", json={"message": message, "chatId": chat, **extra})
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["runId"]
    waited = http.get(f"/v1/runs/{run_id}/wait", params={"timeout": timeout}, timeout=timeout + 10)
    assert waited.status_code == 200, waited.text
    return {"runId": run_id, **waited.json()}


def sse_events(http: httpx.Client, run_id: str) -> list[tuple[str, dict]]:
    out = []
    with http.stream("GET", f"/v1/runs/{run_id}/events") as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                out.append((event, json.loads(line[5:])))
    return out


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def stack(request: pytest.FixtureRequest, redis_url: str, llm: ScriptedLLMServer,
          logs_dir: Path) -> Iterator[Stack]:
    provider = request.param
    # "ponder" streams its reasoning; the default agent does not.
    env = {**provider_env(llm, provider),
           "FERMIX_AGENTS": json.dumps([{"name": "ponder", "stream_thinking": True}])}
    s = start_stack(provider, redis_url, 1 if provider == "openai" else 2, env, logs_dir)
    s.provider = provider  # type: ignore[attr-defined]
    yield s
    s.stop()


def requests_for(llm: ScriptedLLMServer, text: str) -> list[dict]:
    """The provider requests whose conversation contains ``text``."""
    return [r for r in turn_calls(llm.script.requests) if text in json.dumps(r["body"])]


def test_a_turn_answers_with_the_streamed_reply(stack: Stack, llm: ScriptedLLMServer) -> None:
    text = uniq("hello")
    llm.script.push(Reply(text="Hello there, this reply was streamed in pieces.", match=text))
    with stack.http() as http:
        result = run_turn(http, text, uniq("chat"))
        assert result["status"] == "ok", result
        assert result["reply"] == "Hello there, this reply was streamed in pieces."
        assert result["startedAt"] <= result["endedAt"]

        run = http.get(f"/v1/runs/{result['runId']}").json()
        assert run["status"] == "ok"
        assert run["reply"] == "Hello there, this reply was streamed in pieces."
        assert run["conversation"]["channel"] == "http"
        assert run["conversation"]["threadScope"] == "root"

        events = sse_events(http, result["runId"])
    kinds = [(e, d.get("phase")) for e, d in events]
    assert kinds[0] == ("lifecycle", "start") and kinds[-1] == ("lifecycle", "end")
    deltas = [d["delta"] for e, d in events if e == "assistant"]
    assert len(deltas) > 1, "the reply should arrive as several streamed deltas"
    assert "".join(deltas) == "Hello there, this reply was streamed in pieces."

    (req,) = requests_for(llm, text)
    assert req["provider"] == stack.provider  # type: ignore[attr-defined]
    assert req["body"]["stream"] is True


def test_a_tool_call_turn_runs_the_tool_and_answers(stack: Stack, llm: ScriptedLLMServer) -> None:
    # The built-in scripted model asks for the calculator, then reports its result.
    chat = uniq("chat")
    with stack.http() as http:
        result = run_turn(http, "what is 6*7", chat)
        assert result["status"] == "ok", result
        assert "6*7 = 42" in result["reply"]
        events = sse_events(http, result["runId"])
    kinds = [e for e, _ in events if e != "diagnostic"]
    assert kinds[0] == "lifecycle" and kinds[-1] == "lifecycle"
    assert kinds.index("tool") < kinds.index("assistant"), "tool events, then the streamed answer"
    assert "".join(d["delta"] for e, d in events if e == "assistant") == result["reply"]
    iterations = [d["iteration"] for e, d in events if e == "diagnostic" and d["kind"] == "iteration"]
    assert iterations == [1, 2]
    # Not verbose (the operator's default): which tool, its call and outcome, no details.
    call_id = next(d["callId"] for e, d in events if e == "tool")
    assert [d for e, d in events if e == "tool"] == [
        {"phase": "start", "name": "calculator", "callId": call_id},
        {"phase": "result", "name": "calculator", "callId": call_id, "isError": False}]


def test_a_verbose_run_streams_the_tool_calls_arguments_and_results(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    assert quoted("S", "Tool details are stripped unless verbose mode allows them.")
    with stack.http() as http:
        result = run_turn(http, "what is 6*7", uniq("chat"), verbose=True)
        assert result["status"] == "ok", result
        events = sse_events(http, result["runId"])
        assert http.post("/v1/agent", json={"message": "hi", "verbose": "yes"}).status_code == 422
    tool_events = [d for e, d in events if e == "tool"]
    assert [(d["phase"], d["name"]) for d in tool_events] == [
        ("start", "calculator"), ("result", "calculator")]
    assert tool_events[0]["args"] == {"expression": "6*7"}
    assert tool_events[1]["result"] == "6*7 = 42" and tool_events[1]["isError"] is False


def test_history_is_kept_per_conversation(stack: Stack, llm: ScriptedLLMServer) -> None:
    chat, first, second = uniq("chat"), uniq("first"), uniq("second")
    with stack.http() as http:
        assert run_turn(http, first, chat)["status"] == "ok"
        assert run_turn(http, second, chat)["status"] == "ok"
        # Another chat does not see this conversation.
        other = uniq("other")
        assert run_turn(http, other, uniq("chat"))["status"] == "ok"
    (req,) = requests_for(llm, second)
    body = json.dumps(req["body"])
    assert first in body and f'you said \\"{first}\\"' in body
    (req_other,) = requests_for(llm, other)
    assert first not in json.dumps(req_other["body"])


def test_the_same_message_id_runs_one_turn(stack: Stack, llm: ScriptedLLMServer) -> None:
    text, chat = uniq("once"), uniq("chat")
    with stack.http() as http:
        body = {"message": text, "chatId": chat, "messageId": "m-1"}
        a = http.post("/v1/agent", json=body).json()
        b = http.post("/v1/agent", json=body).json()
        assert a["runId"] == b["runId"] and b["duplicate"] is True
        assert http.get(f"/v1/runs/{a['runId']}/wait", params={"timeout": 30}).json()["status"] == "ok"
    assert len(requests_for(llm, text)) == 1


def test_fermix_agent_prints_the_reply(stack: Stack) -> None:
    chat = uniq("cli")
    proc = subprocess.run(
        [sys.executable, "-m", "fermix_cli", "agent", "-m", "hi", "--chat", chat],
        env={**stack.env, "FERMIX_GATEWAY_URL": stack.url},
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'Scripted reply: you said "hi"'


def test_fermix_agent_timeout_bounds_the_whole_wait(stack: Stack, llm: ScriptedLLMServer) -> None:
    # The model takes 20 s; the gateway's SSE keepalive (every second) must not keep the CLI
    # waiting past --timeout. It gives up, says the run goes on, and names it.
    text, chat = uniq("slow-cli"), uniq("cli")
    llm.script.push(Reply(text="too late", delay=20.0, match=text))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fermix_cli", "agent", "-m", text, "--chat", chat,
         "--timeout", "2"],
        env={**stack.env, "FERMIX_GATEWAY_URL": stack.url},
        capture_output=True, text=True, timeout=60,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert 2.0 <= elapsed < 5.0, f"took {elapsed:.1f} s for --timeout 2"
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    match = re.fullmatch(r"fermix: no answer within 2 s; run (run_\w+) is still running on the "
                         r"gateway \(GET /v1/runs/\1 shows how it ends\)", line)
    assert match, line
    with stack.http() as http:
        assert http.get(f"/v1/runs/{match[1]}").json()["status"] in ("queued", "running")
        # Done with it: free the worker slot rather than leave the stack a 20 s turn.
        assert http.post("/v1/agent", json={"message": "/stop", "chatId": chat}).status_code == 202


def test_fermix_agent_refuses_a_negative_timeout() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fermix_cli", "agent", "-m", "hi", "--timeout", "-1"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 2
    assert "--timeout: expected seconds (a number >= 0), not '-1'" in proc.stderr


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "message: Field required"),
        ({"message": ""}, "message must not be empty"),
        ({"message": "   "}, "message must not be empty"),
        ({"message": 5}, "message: Input should be a valid string"),
        ({"message": "hi", "chatId": "two words"}, "chatId"),
        ({"message": "hi", "chatId": ["x"]}, "chatId"),
        ({"message": "hi", "profile": "turbo"}, "profile"),
        ({"message": "hi", "surprise": 1}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_bad_input_is_refused_with_a_reason(stack: Stack, body: dict, reason: str) -> None:
    with stack.http() as http:
        resp = http.post("/v1/agent", json=body)
    assert resp.status_code == 422
    assert reason in resp.json()["error"]


def test_malformed_requests_get_4xx(stack: Stack) -> None:
    with stack.http() as http:
        bad_json = http.post("/v1/agent", content=b"{not json", headers={"content-type": "application/json"})
        assert bad_json.status_code == 422 and "JSON" in bad_json.json()["error"]
        missing = http.get("/v1/runs/run_does_not_exist")
        assert missing.status_code == 404 and "run_does_not_exist" in missing.json()["error"]
        assert http.get("/v1/runs/run_nope/wait").status_code == 404
        assert http.get("/v1/runs/x/wait", params={"timeout": -1}).status_code == 422


def test_wait_times_out_while_the_turn_is_still_running(stack: Stack, llm: ScriptedLLMServer) -> None:
    text = uniq("slow")
    llm.script.push(Reply(text="finally", delay=3.0, match=text))
    with stack.http() as http:
        run_id = http.post("/v1/agent", json={"message": text, "chatId": uniq("c")}).json()["runId"]
        started = time.monotonic()
        early = http.get(f"/v1/runs/{run_id}/wait", params={"timeout": 0.5}).json()
        assert early["status"] == "timeout"
        assert time.monotonic() - started < 3.0
        late = http.get(f"/v1/runs/{run_id}/wait", params={"timeout": 30}).json()
        assert late["status"] == "ok" and late["reply"] == "finally"


# --- stacks with a different configuration -------------------------------------------------


def test_api_token_is_required_when_set(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> None:
    s = start_stack("auth", redis_url, 3, {**provider_env(llm, "openai"), "FERMIX_API_TOKEN": "s3cret"},
                    logs_dir, workers=0)
    try:
        with s.http() as anon, s.http("wrong") as wrong, s.http("s3cret") as ok:
            r = anon.post("/v1/agent", json={"message": "hi"})
            assert r.status_code == 401 and "missing bearer token" in r.json()["error"]
            r = wrong.post("/v1/agent", json={"message": "hi"})
            assert r.status_code == 401 and r.json()["error"] == "invalid bearer token"
            assert wrong.get("/v1/runs/anything").status_code == 401
            assert ok.post("/v1/agent", json={"message": "hi"}).status_code == 202
            assert anon.get("/healthz").status_code == 200
    finally:
        s.stop()
    assert "s3cret" not in (logs_dir / "auth-gateway.log").read_text()


def test_an_unreachable_provider_ends_the_run_in_error(redis_url: str, logs_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"FERMIX_PROVIDER": "openai", "FERMIX_MODEL": "m", "OPENAI_API_KEY": "k",
           "OPENAI_BASE_URL": dead + "/v1"}
    s = start_stack("unreachable", redis_url, 4, env, logs_dir)
    try:
        with s.http() as http:
            started = time.monotonic()
            result = run_turn(http, "hello?", "c1", timeout=60)
        assert result["status"] == "error"
        assert result["error"].startswith("I couldn't reach the model provider (openai)")
        assert time.monotonic() - started < 20
    finally:
        s.stop()


def test_a_stream_dropped_after_content_ends_the_run_in_error(stack: Stack, llm: ScriptedLLMServer) -> None:
    # Once text reached the user, the call is neither retried nor failed over (it would repeat).
    text = uniq("drop")
    llm.script.push(Disconnect(after_chunks=5, match=text))
    with stack.http() as http:
        result = run_turn(http, text, uniq("c"))
        deltas = [d for e, d in sse_events(http, result["runId"]) if e == "assistant"]
    provider = stack.provider  # type: ignore[attr-defined]
    assert deltas, "some text was streamed before the drop"
    assert result["status"] == "error"
    assert result["error"].startswith(f"I couldn't reach the model provider ({provider})")
    assert len(requests_for(llm, text)) == 1


def test_reasoning_is_a_thinking_event_and_anthropic_blocks_are_replayed(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    text = uniq("ponder")
    llm.script.push(
        Reply(thinking="Let me work out 6*7 first.", match=text,
              tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
        Reply(text="42.", match=text),
    )
    assert quoted("S", "`thinking`: streamed reasoning text when enabled")
    with stack.http() as http:
        result = run_turn(http, text, uniq("c"), agent="ponder")
        events = sse_events(http, result["runId"])
    assert result["status"] == "ok" and result["reply"] == "42."
    assert [d["text"] for e, d in events if e == "thinking"] == ["Let me work out 6*7 first."]
    if stack.provider == "anthropic":  # type: ignore[attr-defined]
        # With extended thinking, the thinking block (and its signature) must go back to the
        # API ahead of the tool result.
        second = [q for q in turn_calls(llm.script.requests) if text in json.dumps(q["body"])][1]
        assistant = [m for m in second["body"]["messages"] if m["role"] == "assistant"][-1]
        assert assistant["content"][0] == {
            "type": "thinking", "thinking": "Let me work out 6*7 first.", "signature": "scripted-sig"}


def test_an_agent_without_stream_thinking_keeps_its_reasoning_off_the_stream(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    text = uniq("quiet")
    llm.script.push(
        Reply(thinking="Private reasoning.", match=text,
              tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
        Reply(text="42.", match=text),
    )
    with stack.http() as http:
        result = run_turn(http, text, uniq("c"))  # the default agent
        events = sse_events(http, result["runId"])
    assert result["status"] == "ok" and result["reply"] == "42."
    assert [e for e, _ in events if e == "thinking"] == []
    assert "Private reasoning." not in json.dumps(events)
    if stack.provider == "anthropic":  # type: ignore[attr-defined]
        # Off the stream, not out of the turn: the block still goes back to the model.
        second = [q for q in turn_calls(llm.script.requests) if text in json.dumps(q["body"])][1]
        assert "Private reasoning." in json.dumps(second["body"])
