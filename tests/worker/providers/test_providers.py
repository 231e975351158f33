"""Adapter edges: error translation, reset-time parsing, user messages, the routes in
fermix.toml and the process-wide factories."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import openai
import pytest

from fermix_dev.scripted_llm import Fail, Reply, ScriptedLLMServer
from fermix_shared.errors import (
    AllProvidersFailed,
    ConfigError,
    ProviderError,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    ProviderUnavailable,
)
from fermix_shared.messages import ChatMessage
from fermix_shared.provider_routes import RouteConfig
from fermix_shared.settings import Settings
from fermix_worker.providers import (
    ModelRequest,
    build_router,
    failure_message,
    get_provider,
    get_router,
)
from fermix_worker.providers.errors import retry_after, translate

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": "300"}, 300.0),
        ({"retry-after": "Tue, 01 Jan 2030 12:02:00 GMT"}, 120.0),
        ({"anthropic-ratelimit-requests-reset": "2030-01-01T12:05:00Z"}, 300.0),
        ({"x-ratelimit-reset-requests": "1m30s", "x-ratelimit-reset-tokens": "20ms"}, 90.0),
        ({"x-ratelimit-reset-requests": "soon"}, None),
        ({}, None),
    ],
)
def test_reset_times_are_read_from_every_header_shape(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after(httpx2.Headers(headers), now=lambda: NOW) == seconds


def _openai_status_error(status: int, body: dict[str, str]) -> openai.APIStatusError:
    response = httpx2.Response(status, request=httpx2.Request("POST", "http://127.0.0.1/v1/x"))
    cls = openai.RateLimitError if status == 429 else openai.APIStatusError
    return cls(body["message"], response=response, body=body)


def test_openai_insufficient_quota_is_a_quota_error_not_a_pacing_one() -> None:
    exc = _openai_status_error(
        429, {"message": "You exceeded your current quota", "code": "insufficient_quota",
              "type": "insufficient_quota"},
    )  # fmt: skip
    err = translate(exc, "openai", openai)
    assert isinstance(err, ProviderQuotaExceeded) and not err.transient
    assert failure_message(err) == (
        "Your openai quota is used up. Check the plan and billing, then try again."
    )


def test_server_errors_are_transient_and_client_errors_are_not() -> None:
    assert translate(_openai_status_error(503, {"message": "x"}), "openai", openai).transient
    assert not translate(_openai_status_error(404, {"message": "x"}), "openai", openai).transient


def test_messages_for_every_terminal_error() -> None:
    assert failure_message(ProviderRateLimited("r", provider="openai", retry_after=61)) == (
        "You’ve hit your openai usage limit. Try again in ~2 min."
    )
    assert failure_message(ProviderQuotaExceeded("q", provider="anthropic", retry_after=5)) == (
        "You’ve hit your anthropic usage limit. Try again in ~1 min."
    )
    assert failure_message(ProviderUnavailable("refused", provider="openai")) == (
        "I couldn't reach the model provider (openai): refused"
    )
    assert failure_message(ProviderError("boom", provider="openai", status=400)) == (
        "The model provider failed: boom"
    )
    same_provider_twice = AllProvidersFailed([
        ("openai/a", ProviderUnavailable("t", provider="openai", timeout=True)),
        ("openai/b", ProviderQuotaExceeded("q", provider="openai")),
    ])
    assert failure_message(same_provider_twice) == (
        "All model providers failed (openai/a: timed out; openai/b: quota used up). "
        "Please try again in a moment."
    )


def test_the_router_is_built_once_per_process_and_adapters_still_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    settings = Settings(provider="openai", model="m1")
    router = get_router(settings)
    assert get_router(settings) is router
    assert [r.name for r in router.routes] == ["openai/m1"]
    assert get_provider("openai", settings).name == "openai"


def test_a_route_whose_key_variable_is_unset_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FERMIX_NO_SUCH_KEY", raising=False)
    settings = Settings(routes=[RouteConfig(provider="openai", model="x",
                                            api_key_env="FERMIX_NO_SUCH_KEY")])  # fmt: skip
    with pytest.raises(ConfigError, match="FERMIX_NO_SUCH_KEY"):
        get_router(settings)


def test_routes_come_from_the_toml_named_by_fermix_config(
    llm: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FERMIX_TEST_TOML_KEY", "test-key")
    cfg = tmp_path / "fermix.toml"
    cfg.write_text(
        f'[[routes]]\nprovider = "anthropic"\nmodel = "toml-prim"\ntimeout = 5\n'
        f'base_url = "{llm.anthropic_base_url}"\napi_key_env = "FERMIX_TEST_TOML_KEY"\n\n'
        f'[[routes]]\nprovider = "openai"\nmodel = "toml-fall"\n'
        f'base_url = "{llm.openai_base_url}"\napi_key_env = "FERMIX_TEST_TOML_KEY"\n'
    )
    monkeypatch.setenv("FERMIX_CONFIG", str(cfg))
    settings = Settings()
    assert [(r.provider, r.model, r.timeout) for r in settings.routes] == [
        ("anthropic", "toml-prim", 5.0), ("openai", "toml-fall", None)
    ]
    router = build_router(settings, sleep=lambda s: None)
    assert [r.name for r in router.routes] == ["anthropic/toml-prim", "openai/toml-fall"]
    token = "tok-toml-routes"
    llm.script.push(Fail(429, match=token), Reply("from the toml fallback", match=token))
    request = ModelRequest("x", "s", [ChatMessage(role="user", content=token)])
    turn = router.complete(request, lambda t: None, initial=True)
    assert turn.content == "from the toml fallback"
    models = [r["body"]["model"] for r in llm.script.requests if token in json.dumps(r["body"])]
    assert models == ["toml-prim", "toml-fall"]


def test_without_routes_the_chain_is_fermix_provider_and_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FERMIX_PROVIDER", "anthropic")
    monkeypatch.setenv("FERMIX_MODEL", "env-model")
    router = build_router(Settings())
    assert [(r.name, r.provider, r.model, r.base_url) for r in router.routes] == [
        ("anthropic/env-model", "anthropic", "env-model", None)
    ]


def test_reasoning_effort_reaches_the_wire_for_both_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-call subagent routing: OpenAI gets reasoning_effort, Anthropic a thinking budget."""
    from fermix_dev.scripted_llm import ScriptedLLMServer
    from fermix_shared.messages import ChatMessage
    from fermix_shared.settings import Settings
    from fermix_worker.providers.base import ModelRequest
    from fermix_worker.providers.routes import ProviderRoute, adapter_for

    monkeypatch.setenv("FERMIX_TEST_ROUTE_KEY", "test-key")
    with ScriptedLLMServer() as srv:
        settings = Settings(redis_url="redis://unused")
        for provider, base in (("openai", srv.openai_base_url), ("anthropic", srv.anthropic_base_url)):
            route = ProviderRoute(f"{provider}/m", provider, "m", base_url=base, api_key_env="FERMIX_TEST_ROUTE_KEY")
            adapter = adapter_for(route, settings)
            request = ModelRequest(model="m", system="s", max_tokens=512, reasoning_effort="medium",
                                   messages=[ChatMessage(role="user", content="think")])
            adapter.chat(request, lambda _: None)
        openai_body, anthropic_body = (r["body"] for r in srv.script.requests)
    assert openai_body["reasoning_effort"] == "medium"
    assert anthropic_body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert anthropic_body["max_tokens"] > 4096


def test_a_system_notice_reaches_both_wires_after_the_tool_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop guard's notice: OpenAI gets a system message; Anthropic, which has no system
    role inside a conversation, a text block after the tool result in the same user turn."""
    from fermix_shared.messages import ToolCall
    from fermix_worker.providers.routes import ProviderRoute, adapter_for

    monkeypatch.setenv("FERMIX_TEST_ROUTE_KEY", "test-key")
    messages = [
        ChatMessage(role="user", content="find it"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="t1", name="search", arguments={})]),
        ChatMessage(role="tool", content="nothing", tool_call_id="t1", tool_name="search"),
        ChatMessage(role="system", content="**LOOP DETECTED**: stop"),
    ]
    with ScriptedLLMServer() as srv:
        settings = Settings(redis_url="redis://unused")
        for provider, base in (("openai", srv.openai_base_url), ("anthropic", srv.anthropic_base_url)):
            route = ProviderRoute(f"{provider}/m", provider, "m", base_url=base,
                                  api_key_env="FERMIX_TEST_ROUTE_KEY")
            adapter_for(route, settings).chat(
                ModelRequest(model="m", system="s", max_tokens=64, messages=messages),
                lambda _: None)
        openai_body, anthropic_body = (r["body"] for r in srv.script.requests)
    assert openai_body["messages"][-1] == {"role": "system", "content": "**LOOP DETECTED**: stop"}
    assert openai_body["messages"][-2]["role"] == "tool"
    last = anthropic_body["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    assert last["content"][1]["text"] == "**LOOP DETECTED**: stop"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_continue_sends_the_providers_own_transcript_and_only_the_new_messages(
    monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    """The seed's contract: chat(messages, ...) then continue(provider_state, tool_results,
    ...). The state is the adapter's wire transcript (opaque to the loop, JSON for the
    checkpoint); the continuation sends it verbatim plus the tool results, and a state that
    is not the adapter's own falls back to the neutral messages."""
    from fermix_dev.scripted_llm.script import ToolCallSpec
    from fermix_worker.loop_state import LoopState
    from fermix_worker.providers.routes import ProviderRoute, adapter_for

    monkeypatch.setenv("FERMIX_TEST_ROUTE_KEY", "test-key")
    user = ChatMessage(role="user", content="what is 6*7?")
    with ScriptedLLMServer() as srv:
        base = srv.openai_base_url if provider == "openai" else srv.anthropic_base_url
        route = ProviderRoute(f"{provider}/m", provider, "m", base_url=base,
                              api_key_env="FERMIX_TEST_ROUTE_KEY")
        settings = Settings(redis_url="redis://unused")
        srv.script.push(Reply(text="Working.", tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
                        Reply(text="42."), Reply(text="42 again."))
        opts = ModelRequest(model="m", system="s", max_tokens=64, messages=[user])
        first = adapter_for(route, settings).chat(opts, lambda _: None)
        assert first.provider_state is not None and first.tool_calls
        # Through a checkpoint, to a new adapter (another worker).
        state = LoopState(run_id="r", model="m", system="s", messages=[user], turn_start=0,
                          provider_state=first.provider_state)
        restored = LoopState.model_validate_json(state.model_dump_json()).provider_state
        result = ChatMessage(role="tool", content="42", tool_call_id=first.tool_calls[0].id,
                             tool_name="calculator")
        second = adapter_for(route, settings).continue_(restored, [result], opts, lambda _: None)
        assert second.content == "42."
        # Another provider's state: answered from the neutral messages.
        alien = {"provider": "elsewhere", "messages": [{"role": "user", "content": "x"}]}
        adapter_for(route, settings).continue_(alien, [], opts, lambda _: None)
        bodies = [r["body"] for r in srv.script.requests]
    sent_first, sent_second, sent_alien = (b["messages"] for b in bodies)
    assert restored is not None
    assert sent_second[: len(restored["messages"])] == restored["messages"]
    assert sent_second[: len(sent_first)] == sent_first  # the first call's transcript, as sent
    assistant = sent_second[len(sent_first)]
    assert assistant["role"] == "assistant" and "Working." in json.dumps(assistant)
    assert "42" in json.dumps(sent_second[len(sent_first) + 1:])  # then the tool result
    assert sent_alien == sent_first  # neutral: the user message alone
