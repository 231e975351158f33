"""Scripted LLM server driven through the real ``openai`` and ``anthropic`` SDK clients."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from fermix_dev.scripted_llm import (
    Disconnect,
    Fail,
    Hang,
    Reply,
    ScriptedLLMServer,
    ToolCallSpec,
    Usage,
    entries_from_json,
    entry_from_json,
)

CALC_TOOL_OPENAI: Any = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
TIME_TOOL_OPENAI: Any = {
    "type": "function",
    "function": {"name": "current_time", "parameters": {"type": "object", "properties": {}}},
}
CALC_TOOL_ANTHROPIC: Any = {
    "name": "calculator",
    "description": "Evaluate arithmetic",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _reset(server: ScriptedLLMServer) -> None:
    server.script.reset()


@pytest.fixture
def oai(server: ScriptedLLMServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(server: ScriptedLLMServer) -> Iterator[anthropic.Anthropic]:
    url = server.anthropic_base_url
    with anthropic.Anthropic(base_url=url, api_key="test", max_retries=0) as client:
        yield client


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


# --- OpenAI -----------------------------------------------------------------------------------


def test_openai_non_streaming_text_and_usage(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    server.script.push(Reply("Hello from the script", usage=Usage(11, 5)))
    resp = oai.chat.completions.create(model="gpt-test", messages=user("hi"))
    assert resp.choices[0].message.content == "Hello from the script"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.model == "gpt-test"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (11, 5)
    assert resp.usage.total_tokens == 16


def test_openai_streaming_text_with_usage_chunk(
    server: ScriptedLLMServer, oai: openai.OpenAI
) -> None:
    server.script.push(Reply("one two three four"))
    stream = oai.chat.completions.create(
        model="gpt-test",
        messages=user("hi"),
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == "one two three four"
    assert len([p for p in pieces if p]) >= 4
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


def test_openai_streamed_tool_call(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    args = {"expression": "(1 + 2) * 3", "nested": {"xs": [1, 2, 3]}}
    server.script.push(Reply(tool_calls=[ToolCallSpec("calculator", args, id="call_1")]))
    calls: dict[int, dict[str, str]] = {}
    finish = None
    stream = oai.chat.completions.create(
        model="gpt-test", messages=user("calc"), tools=[CALC_TOOL_OPENAI], stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                acc = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                acc["id"] += tc.id or ""
                if tc.function is not None:
                    acc["name"] += tc.function.name or ""
                    acc["arguments"] += tc.function.arguments or ""
    assert finish == "tool_calls"
    assert calls[0]["id"] == "call_1"
    assert calls[0]["name"] == "calculator"
    assert json.loads(calls[0]["arguments"]) == args


def test_openai_stream_helper_accumulates(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    server.script.push(Reply("Let me check.", tool_calls=[ToolCallSpec("calculator", {"x": 1})]))
    # The SDK's helper (under ``beta`` in older openai releases).
    helper = getattr(oai.chat.completions, "stream", None) or oai.beta.chat.completions.stream
    with helper(
        model="gpt-test", messages=user("calc"), tools=[CALC_TOOL_OPENAI]
    ) as stream:
        final = stream.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Let me check."
    assert msg.tool_calls is not None
    assert msg.tool_calls[0].function.name == "calculator"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"x": 1}


# --- Anthropic --------------------------------------------------------------------------------


def test_anthropic_non_streaming_text_and_usage(
    server: ScriptedLLMServer, claude: anthropic.Anthropic
) -> None:
    server.script.push(Reply("Bonjour", usage=Usage(input_tokens=7, output_tokens=3)))
    msg = claude.messages.create(model="claude-test", max_tokens=64, messages=user("hi"))
    assert msg.content[0].type == "text" and msg.content[0].text == "Bonjour"
    assert msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (7, 3)


def test_anthropic_streaming_text(server: ScriptedLLMServer, claude: anthropic.Anthropic) -> None:
    server.script.push(Reply("streamed words arrive here", usage=Usage(4, 9)))
    with claude.messages.stream(model="claude-test", max_tokens=64, messages=user("hi")) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == "streamed words arrive here"
    assert len(pieces) >= 4
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 9)


def test_anthropic_streamed_tool_call(
    server: ScriptedLLMServer, claude: anthropic.Anthropic
) -> None:
    args = {"expression": "6 * 7", "options": {"precision": 2, "tags": ["a", "b"]}}
    server.script.push(Reply("Calling.", tool_calls=[ToolCallSpec("calculator", args)]))
    with claude.messages.stream(
        model="claude-test", max_tokens=64, messages=user("calc"), tools=[CALC_TOOL_ANTHROPIC]
    ) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    tool = final.content[1]
    assert tool.type == "tool_use"
    assert tool.name == "calculator" and tool.input == args
    assert tool.id.startswith("toolu_")


# --- failures ---------------------------------------------------------------------------------


def test_rate_limit_surfaces_as_sdk_error(
    server: ScriptedLLMServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    server.script.push(Fail(429, "slow down", retry_after=7), Fail(429, retry_after=7))
    with pytest.raises(openai.RateLimitError) as oerr:
        oai.chat.completions.create(model="m", messages=user("x"))
    assert oerr.value.status_code == 429
    assert oerr.value.response.headers["retry-after"] == "7"
    assert oerr.value.code == "rate_limit_exceeded"
    assert "slow down" in str(oerr.value)
    with pytest.raises(anthropic.RateLimitError) as aerr:
        claude.messages.create(model="m", max_tokens=8, messages=user("x"))
    assert aerr.value.status_code == 429
    assert aerr.value.response.headers["retry-after"] == "7"
    assert "anthropic-ratelimit-requests-reset" in aerr.value.response.headers
    assert isinstance(aerr.value.body, dict)
    assert aerr.value.body["error"]["type"] == "rate_limit_error"


def test_server_error_surfaces_as_internal_server_error(
    server: ScriptedLLMServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    server.script.push(Fail(500), Fail(500))
    with pytest.raises(openai.InternalServerError) as oerr:
        oai.chat.completions.create(model="m", messages=user("x"), stream=True)
    assert oerr.value.status_code == 500
    with pytest.raises(anthropic.InternalServerError) as aerr:
        claude.messages.create(model="m", max_tokens=8, messages=user("x"))
    assert aerr.value.status_code == 500
    assert isinstance(aerr.value.body, dict)
    assert aerr.value.body["error"]["type"] == "api_error"


def test_hang_lets_client_time_out(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    server.script.push(Hang(10))
    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        oai.with_options(timeout=0.3).chat.completions.create(model="m", messages=user("x"))
    assert time.monotonic() - start < 2


def test_disconnect_mid_stream(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    server.script.push(Disconnect(after_chunks=3))
    received = 0
    # The SDK's connection error (older openai releases let the HTTP library's own through).
    with pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError)):
        for _chunk in oai.chat.completions.create(model="m", messages=user("x"), stream=True):
            received += 1
    assert received == 3


# --- routing, default responder, control API --------------------------------------------------


def test_match_routes_to_request_containing_it(
    server: ScriptedLLMServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    server.script.push(Reply("for bananas", match="banana"), Reply("generic"))
    first = oai.chat.completions.create(model="m", messages=user("no fruit here"))
    assert first.choices[0].message.content == "generic"
    second = claude.messages.create(model="m", max_tokens=8, messages=user("I like banana"))
    assert second.content[0].type == "text" and second.content[0].text == "for bananas"
    assert len(server.script) == 0


def test_delays_do_not_block_other_requests(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    server.script.push(Reply("slow", delay=0.6, match="slow"), Reply("fast", match="fast"))
    done: list[str] = []

    def ask(text: str) -> None:
        resp = oai.chat.completions.create(model="m", messages=user(text))
        done.append(resp.choices[0].message.content or "")

    slow = threading.Thread(target=ask, args=("slow",))
    slow.start()
    time.sleep(0.1)  # let the slow request reach the server first
    start = time.monotonic()
    ask("fast")
    assert time.monotonic() - start < 0.4
    slow.join()
    assert done == ["fast", "slow"]


def test_default_responder_tool_calls_and_echo(
    server: ScriptedLLMServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    resp = oai.chat.completions.create(
        model="m", messages=user("What time is it?"), tools=[TIME_TOOL_OPENAI, CALC_TOOL_OPENAI]
    )
    calls = resp.choices[0].message.tool_calls
    assert calls is not None and calls[0].type == "function"
    assert calls[0].function.name == "current_time"
    assert json.loads(calls[0].function.arguments) == {}
    assert resp.choices[0].finish_reason == "tool_calls"

    msg = claude.messages.create(
        model="m", max_tokens=64, messages=user("what is 2 + 3?"), tools=[CALC_TOOL_ANTHROPIC]
    )
    tool = msg.content[0]
    assert tool.type == "tool_use" and tool.name == "calculator"
    assert tool.input == {"expression": "2 + 3"}

    conversation: Any = [
        *user("what is 2 + 3?"),
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "5"}],
        },
    ]
    followup = claude.messages.create(
        model="m", max_tokens=64, tools=[CALC_TOOL_ANTHROPIC], messages=conversation
    )
    assert followup.content[0].type == "text"
    assert followup.content[0].text == "Tool calculator returned: 5"

    tool_turn: Any = [
        *user("What time is it?"),
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "12:00"},
    ]
    answer = oai.chat.completions.create(model="m", messages=tool_turn)
    assert answer.choices[0].message.content == "Tool current_time returned: 12:00"

    echo = oai.chat.completions.create(model="m", messages=user("just chatting"))
    assert echo.choices[0].message.content == 'Scripted reply: you said "just chatting"'


def test_control_endpoints_and_request_log(server: ScriptedLLMServer, oai: openai.OpenAI) -> None:
    entries = [Reply("pushed over http", match="http").to_json(), Fail(503).to_json()]
    assert entries_from_json(entries) == [entry_from_json(e) for e in entries]
    pushed = httpx.post(f"{server.url}/_scripted/push", json=entries)
    assert pushed.json() == {"pending": 2}
    resp = oai.chat.completions.create(model="m", messages=user("via http"))
    assert resp.choices[0].message.content == "pushed over http"
    log = httpx.get(f"{server.url}/_scripted/requests").json()
    assert log[-1]["provider"] == "openai"
    assert log[-1]["path"] == "/v1/chat/completions"
    assert log[-1]["body"]["messages"] == user("via http")
    assert log[-1]["headers"]["content-type"] == "application/json"
    assert httpx.post(f"{server.url}/_scripted/reset").status_code == 200
    assert server.script.requests == [] and len(server.script) == 0
    bad = httpx.post(f"{server.url}/_scripted/push", json=[{"kind": "nope"}])
    assert bad.status_code == 422


def test_embeddings_are_deterministic_in_both_encodings_and_fail_on_cue(
    oai: openai.OpenAI, server: ScriptedLLMServer
) -> None:
    texts = ["The user grows tomatoes.", "Tomatoes grow in the garden.", "The cat is Miso."]
    as_base64 = oai.embeddings.create(model="m", input=texts)  # the SDK's default encoding
    as_float = oai.embeddings.create(model="m", input=texts, encoding_format="float")
    vectors = [d.embedding for d in as_float.data]
    for decoded, plain in zip(as_base64.data, vectors, strict=True):
        assert decoded.embedding == pytest.approx(plain, abs=1e-6)

    def cos(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))  # unit length

    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2])
    server.script.push(Fail(503, "embeddings are down", match="Miso"))
    with pytest.raises(openai.InternalServerError, match="embeddings are down"):
        oai.embeddings.create(model="m", input=texts)
    assert [q["entry"] for q in server.script.embedding_requests] == [
        "embeddings", "embeddings", "fail"]
    assert server.script.requests == []  # model calls only
