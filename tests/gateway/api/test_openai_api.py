"""The OpenAI-compatible API, driven by the official ``openai`` SDK as any OpenAI client would.

Fast tests run the real gateway app in-process (starlette's TestClient as the SDK's HTTP
client, a private Redis): the model list, refusals and their OpenAI error shapes, commands
(answered at once, no worker needed). Fleet tests run one real stack (uvicorn gateway, a
``celery worker``, the scripted LLM through the openai SDK) with an API token set: turns,
streamed and not, usage, conversation continuity, run failures, auth.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import openai
import pytest
import redis
from fastapi.testclient import TestClient

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail, Reply, ToolCallSpec, Usage
from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import chat_history, first_event, turn_calls, uniq
from tests.gateway.inprocess import RecordingCelery

AGENTS = [{"name": "coder", "model": "coder-model"}, {"name": "helper", "role": "sub"}]
TOKEN = "oai-s3cret"


# --- in-process ----------------------------------------------------------------------------


@contextmanager
def inprocess(redis_url: str, **limits: int) -> Iterator[tuple[openai.OpenAI, TestClient]]:
    """The SDK over the app in-process (its HTTP client is the TestClient), and that client."""
    settings = Settings(redis_url=redis_url, agents=AGENTS, limits=limits)
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="unused",
                            http_client=http, max_retries=0), http


def test_models_are_the_agents_that_answer_chats(r: redis.Redis, scratch_redis_url: str) -> None:
    with inprocess(scratch_redis_url) as (client, _):
        models = client.models.list()
        assert [m.id for m in models.data] == ["fermix/default", "fermix/coder"]
        assert {(m.object, m.owned_by) for m in models.data} == {("model", "fermix")}
        assert client.models.retrieve("fermix/coder").id == "fermix/coder"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("fermix/helper")  # a sub agent answers no chat


def test_an_unknown_model_is_not_found_and_nothing_is_queued(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with inprocess(scratch_redis_url) as (client, _), pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="fermix/nope", user="c1",
                                       messages=[{"role": "user", "content": "hi"}])
    err = caught.value.body
    assert isinstance(err, dict) and err["code"] == "model_not_found" and err["param"] == "model"
    assert "'fermix/nope' does not exist; models: fermix/default, fermix/coder" in err["message"]
    assert r.llen(keys.inbox("http|c1|root")) == 0


@pytest.mark.parametrize(("messages", "param", "reason"), [
    ([], "messages", "at least 1 item"),
    ([{"role": "assistant", "content": "hello"}], "messages", "role 'user'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content", "only text content is supported, not image_url"),
    ([{"role": "user", "content": "   "}], "messages[0].content", "must not be empty"),
    ([{"role": "wizard", "content": "hi"}], "messages[0].role", "Input should be"),
])
def test_a_bad_request_is_a_400_in_openai_shape(
    r: redis.Redis, scratch_redis_url: str, messages: list[Any], param: str, reason: str
) -> None:
    with inprocess(scratch_redis_url) as (client, _), pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fermix/default", messages=messages)
    err = caught.value.body
    assert isinstance(err, dict) and err["type"] == "invalid_request_error"
    assert err["param"] == param and reason in err["message"]


def test_other_routes_keep_their_own_error_format(r: redis.Redis, scratch_redis_url: str) -> None:
    with inprocess(scratch_redis_url) as (_, http):
        assert http.post("/v1/agent", json={}).json()["error"] == "message: Field required"
        bad_chat = http.post("/v1/chat/completions", headers={"x-fermix-chat": "a b"},
                             json={"model": "default", "messages": [{"role": "user",
                                                                     "content": "hi"}]})
        not_json = http.post("/v1/chat/completions", content=b"{not json",
                             headers={"content-type": "application/json"})
    assert bad_chat.status_code == 400
    assert bad_chat.json()["error"]["param"] == "x-fermix-chat"
    assert not_json.status_code == 400
    assert not_json.json()["error"]["message"] == "body: JSON decode error"


def test_a_message_over_the_limit_is_refused_with_the_reason(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with (inprocess(scratch_redis_url, max_text_chars=10) as (client, _),
          pytest.raises(openai.BadRequestError) as caught):
        client.chat.completions.create(model="fermix/default", user="c1",
                                       messages=[{"role": "user", "content": "x" * 11}])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"].startswith("message: at most 10 characters, got 11")


def test_a_command_is_answered_as_the_completion(r: redis.Redis, scratch_redis_url: str) -> None:
    status = "Here nothing is running; 0 messages queued; queue mode followup."
    with inprocess(scratch_redis_url) as (client, _):
        raw = client.chat.completions.with_raw_response.create(
            model="fermix/default", user="c1",
            messages=[{"role": "user", "content": "earlier, ignored"},
                      {"role": "assistant", "content": "ignored too"},
                      {"role": "user", "content": "/status"}])
        done = raw.parse()
        stream = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "/whoami"}], stream=True)
        chunks = list(stream)
    assert done.choices[0].message.content == status
    assert done.choices[0].finish_reason == "stop" and done.model == "fermix/default"
    run_id = raw.headers["x-fermix-run-id"]
    assert done.id == f"chatcmpl-{run_id}" and raw.headers["x-fermix-chat"] == "c1"
    assert r.exists(keys.run(run_id))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        "You are http:api (operator)."
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_message_stored_but_not_replicated_is_not_retried_into_a_second_turn(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    """``FERMIX_REDIS_WAIT_REPLICAS=1`` on a Redis without replicas: the message is stored on
    the primary, then the wait falls short (a 503). The SDK, with its default two retries,
    must not send it again: each retry would queue it again."""
    settings = Settings(redis_url=scratch_redis_url, redis_wait_replicas=1,
                        redis_wait_timeout_ms=20)
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as http, \
            pytest.raises(openai.InternalServerError) as caught:
        openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http
                      ).chat.completions.create(model="fermix/default", user="c-503",
                                                messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert isinstance(caught.value.body, dict) and "Idempotency-Key" in caught.value.body["message"]
    assert r.llen(keys.inbox("http|c-503|root")) == 1


# --- a real stack --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_API_TOKEN": TOKEN,
           "FERMIX_AGENTS": json.dumps(AGENTS)}
    s = start_stack("openai-compat", redis_url, 3, env, logs_dir)
    yield s
    s.stop()


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key=TOKEN, timeout=60) as c:
        yield c


def calls(llm: ScriptedLLMServer, text: str) -> list[dict[str, Any]]:
    return [q for q in turn_calls(llm.script.requests) if text in json.dumps(q["body"])]


def test_a_completion_is_the_agents_reply(
    stack: Stack, client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    text = uniq("hello")
    llm.script.push(Reply(text="Hello from the coder agent.", match=text,
                          usage=Usage(input_tokens=31, output_tokens=7)))
    raw = client.chat.completions.with_raw_response.create(
        model="fermix/coder", messages=[{"role": "user", "content": text}])
    done = raw.parse()
    assert done.object == "chat.completion" and done.model == "fermix/coder"
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == "Hello from the coder agent."
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == \
        (31, 7, 38)
    run_id = raw.headers["x-fermix-run-id"]
    with stack.http(TOKEN) as http:
        run = http.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "ok" and run["reply"] == "Hello from the coder agent."
    assert run["conversation"]["chatId"] == raw.headers["x-fermix-chat"]
    (call,) = calls(llm, text)
    assert call["body"]["model"] == "coder-model"  # the agent's own model answered


def test_a_streamed_completion_carries_the_reply_in_chunks(
    client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    text = uniq("stream")
    reply = "Streaming, piece by piece, this reply reaches the client as it is written."
    # Pieces 60 ms apart outlast the worker's 50 ms coalescing: several deltas arrive.
    llm.script.push(Reply(text=reply, match=text, chunk_delay=0.06,
                          usage=Usage(input_tokens=20, output_tokens=12)))
    chunks = list(client.chat.completions.create(
        model="fermix/default", messages=[{"role": "user", "content": text}], stream=True,
        stream_options={"include_usage": True}))
    *with_choices, last = chunks
    assert with_choices[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in with_choices if c.choices[0].delta.content]
    assert "".join(contents) == reply and len(contents) > 1
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens == 32


def test_on_a_tool_turn_streamed_and_unstreamed_answers_are_the_same_reply(
    stack: Stack, client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    """Text the model writes before a tool call is part of the reply (Fased: assistant deltas
    add up to it), so the streamed deltas and the non-streamed answer agree byte for byte."""
    answers = []
    for stream in (False, True):
        text = uniq("toolturn")
        llm.script.push(
            Reply(text="Let me work that out.", match=text,
                  tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
            Reply(text="It is 42.", match=text),
        )
        messages: Any = [{"role": "user", "content": text}]
        if stream:
            chunks = client.chat.completions.create(
                model="fermix/default", messages=messages, stream=True)
            answers.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
        else:
            done = client.chat.completions.create(model="fermix/default", messages=messages)
            answers.append(done.choices[0].message.content)
    assert answers == ["Let me work that out.\n\nIt is 42."] * 2


def test_the_user_field_or_header_keeps_the_conversation(
    client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    chat, first, second, third = uniq("conv"), uniq("first"), uniq("second"), uniq("third")
    llm.script.push(Reply(text="Noted: the code word is heron.", match=first),
                    Reply(text="It was heron.", match=second), Reply(text="Still heron.", match=third))
    client.chat.completions.create(model="fermix/default", user=chat,
                                   messages=[{"role": "user", "content": first}])
    # The client's own history is ignored: only the conversation's, kept by Fermix, counts.
    again = client.chat.completions.create(
        model="fermix/default", user=chat,
        messages=[{"role": "user", "content": "a message Fermix never saw"},
                  {"role": "user", "content": second}])
    assert again.choices[0].message.content == "It was heron."
    (call,) = calls(llm, second)
    sent = [(m["role"], m["content"]) for m in call["body"]["messages"][1:]]
    assert ("assistant", "Noted: the code word is heron.") in sent
    assert any(role == "user" and first in content for role, content in sent)
    assert "never saw" not in json.dumps(call["body"])
    # The header names the conversation too, over ``user``.
    client.chat.completions.create(model="fermix/default", user=uniq("other"),
                                   extra_headers={"x-fermix-chat": chat},
                                   messages=[{"role": "user", "content": third}])
    (call,) = calls(llm, third)
    assert "It was heron." in json.dumps(call["body"]["messages"])


def test_a_run_that_fails_is_an_error_naming_it_and_is_not_retried(
    client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    text = uniq("fail")
    # An SDK retry would get the scripted default reply and succeed: the error proves none.
    llm.script.push(Fail(400, "bad request upstream", match=text))
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="fermix/default",
                                       messages=[{"role": "user", "content": text}])
    assert caught.value.status_code == 502
    run_id = caught.value.response.headers["x-fermix-run-id"]
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "run_failed"
    assert caught.value.body["message"].startswith(f"run {run_id} ended in error: ")
    assert len(calls(llm, text)) == 1


def test_stop_ends_a_streamed_completion_with_an_error(
    stack: Stack, client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    chat, text = uniq("stopme"), uniq("slow")
    llm.script.push(Reply(text="too late", match=text, delay=3))
    stream = client.chat.completions.create(
        model="fermix/default", user=chat, stream=True,
        messages=[{"role": "user", "content": text}])
    run_id = stream.response.headers["x-fermix-run-id"]
    with stack.http(TOKEN) as http:  # the turn is running: its worker waits on the model
        assert first_event(http, run_id, "lifecycle")["phase"] == "start"
    stopped = client.chat.completions.create(model="fermix/default", user=chat,
                                             messages=[{"role": "user", "content": "/stop"}])
    assert (stopped.choices[0].message.content or "").startswith("Stopped the current request")
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert caught.value.body == {
        "message": f"run {run_id} was stopped before it answered (/stop, an interrupting "
                   "message, or its agent's queue was cleared)",
        "type": "run_error", "param": None, "code": "run_stopped"}


def test_the_api_token_is_required(stack: Stack) -> None:
    # The SDK insists on a key; an Omit() header takes it off the wire.
    cases: tuple[tuple[str, dict[str, Any], str], ...] = (("wrong", {}, "invalid bearer token"),
             (TOKEN, {"Authorization": openai.Omit()}, "missing bearer token"))
    for key, headers, reason in cases:
        with (openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0) as anon,
              pytest.raises(openai.AuthenticationError) as caught):
            anon.chat.completions.create(model="fermix/default", extra_headers=headers,
                                         messages=[{"role": "user", "content": "hi"}])
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["type"] == "authentication_error"
        assert caught.value.body["message"].startswith(reason)


@pytest.mark.parametrize("user", ["☃", "中文"])
def test_a_non_latin1_user_gets_one_turn_and_a_200(
    stack: Stack, client: openai.OpenAI, llm: ScriptedLLMServer, user: str
) -> None:
    """Issue 25 item 11: the ``x-fermix-chat`` header could not carry ``☃``, the answer was a
    500 after the turn ran, and the SDK's two retries ran it twice more. Now: the SDK with its
    default retries, one call, one turn, one history entry, a 200; the header is the chat id
    percent-encoded, and sending it back names the same conversation."""
    chat = f"{user}-{uniq('u')}"
    text, later = uniq("snow"), uniq("later")
    llm.script.push(Reply(text="A snowman.", match=text), Reply(text="Still here.", match=later))
    assert client.max_retries == 2
    raw = client.chat.completions.with_raw_response.create(
        model="fermix/default", user=chat, messages=[{"role": "user", "content": text}])
    assert raw.status_code == 200
    assert raw.parse().choices[0].message.content == "A snowman."
    assert raw.headers["x-fermix-chat"] == quote(chat)
    assert len(calls(llm, text)) == 1
    again = client.chat.completions.create(
        model="fermix/default", extra_headers={"x-fermix-chat": raw.headers["x-fermix-chat"]},
        messages=[{"role": "user", "content": later}])
    assert again.choices[0].message.content == "Still here."
    assert chat_history(stack.redis(), chat) == [
        ("user", text), ("assistant", "A snowman."), ("user", later), ("assistant", "Still here.")]


def test_an_idempotency_key_makes_a_retry_wait_for_the_same_turn(
    stack: Stack, client: openai.OpenAI, llm: ScriptedLLMServer
) -> None:
    """A client that names its request (``Idempotency-Key``) may send it again after any error
    or a dropped connection: the same run answers, no second turn runs."""
    text, key = uniq("once"), uniq("idem")
    llm.script.push(Reply(text="Only once.", match=text))
    answers = [client.chat.completions.with_raw_response.create(
        model="fermix/default", extra_headers={"Idempotency-Key": key},
        messages=[{"role": "user", "content": text}]) for _ in range(2)]
    assert {a.headers["x-fermix-run-id"] for a in answers} == {answers[0].headers["x-fermix-run-id"]}
    assert [a.parse().choices[0].message.content for a in answers] == ["Only once.", "Only once."]
    assert len(calls(llm, text)) == 1
