"""Agent definitions and bindings as the settings read them: validation, which agent a
conversation gets, and how an agent narrows a message (never widens it)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fermix_shared.agents.definitions import (
    AgentDefinition,
    agent_named,
    agent_names,
    as_agent,
    bound_agent,
    narrow_tools,
    turn_agent,
)
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings


def key(channel: str, chat: str, thread: str = "root") -> ConversationKey:
    return ConversationKey(channel=channel, chat_id=chat, thread_scope=thread)  # type: ignore[arg-type]


def settings(**kw: object) -> Settings:
    return Settings(redis_url="redis://unused", **kw)  # type: ignore[arg-type]


def test_the_most_specific_binding_wins_and_unbound_chats_get_default() -> None:
    s = settings(
        agents=[{"name": "support"}, {"name": "coder"}, {"name": "triage"}],
        bindings=[
            {"agent": "support", "channel": "telegram"},
            {"agent": "coder", "channel": "telegram", "chat": -100123},
            {"agent": "triage", "channel": "slack", "chat": "C1", "thread": "1700.1"},
        ],
    )
    assert bound_agent(s.bindings, key("telegram", "42")) == "support"
    assert bound_agent(s.bindings, key("telegram", "-100123")) == "coder"
    assert bound_agent(s.bindings, key("slack", "C1", "1700.1")) == "triage"
    assert bound_agent(s.bindings, key("slack", "C1")) == "default"
    assert bound_agent(s.bindings, key("http", "x")) == "default"
    assert agent_names(s.agents) == ["default", "support", "coder", "triage"]


@pytest.mark.parametrize(("agents", "bindings", "reason"), [
    ([{"name": "a"}, {"name": "a"}], [], "declared twice"),
    ([], [{"agent": "ghost", "channel": "http"}], "not declared"),
    ([{"name": "w", "role": "sub"}], [{"agent": "w", "channel": "http"}], "'sub' agent"),
    ([{"name": "a"}], [{"agent": "a"}], "needs a channel"),
    ([{"name": "a"}], [{"agent": "a", "channel": "slack", "thread": "1.2"}], "needs its chat"),
    ([{"name": "Bad Name"}], [], "lowercase"),
    ([{"name": "a", "reasoning_effort": "high"}], [], "role 'sub' only"),
    ([{"name": "a", "temperature": 3}], [], "less than or equal to 2"),
    ([{"name": "a", "policy": ["root"]}], [], "read_only"),
    ([{"name": "a", "colour": "blue"}], [], "Extra inputs"),
    ([{"name": "w", "role": "sub", "timeout_seconds": 0}], [], "must be > 0"),
    ([{"name": "a", "timeout_seconds": -1}], [], "greater than or equal to 0"),
])
def test_bad_agent_configuration_is_refused_with_a_reason(
    agents: list[dict[str, object]], bindings: list[dict[str, object]], reason: str
) -> None:
    with pytest.raises(ValidationError, match=reason):
        settings(agents=agents, bindings=bindings)


def test_agents_and_bindings_come_from_toml(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "fermix.toml"
    path.write_text(
        '[[agents]]\nname = "coder"\nmodel = "gpt-coder"\ntemperature = 0.2\n'
        'allowed_tools = []\n\n'
        '[[bindings]]\nagent = "coder"\nchannel = "slack"\nchat = "C9"\n'
    )
    monkeypatch.setenv("FERMIX_CONFIG", str(path))
    s = Settings()
    coder = agent_named(s.agents, "coder")
    assert coder is not None and coder.model == "gpt-coder" and coder.allowed_tools == []
    assert bound_agent(s.bindings, key("slack", "C9")) == "coder"


def test_agents_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERMIX_AGENTS", json.dumps([{"name": "ops", "trust": "guest"}]))
    monkeypatch.setenv("FERMIX_BINDINGS", json.dumps([{"agent": "ops", "channel": "http"}]))
    s = Settings()
    assert bound_agent(s.bindings, key("http", "any")) == "ops"
    assert turn_agent(s.agents, "ops").trust == "guest"


def test_a_message_for_an_agent_that_is_gone_runs_as_default() -> None:
    s = settings(agents=[{"name": "default", "model": "m-default"}])
    assert turn_agent(s.agents, "removed").model == "m-default"


def test_an_agent_route_is_only_an_override_when_it_differs_from_the_primary() -> None:
    assert AgentDefinition(name="a").route("openai", "gpt") is None
    assert AgentDefinition(name="a", model="gpt").route("openai", "gpt") is None
    assert AgentDefinition(name="a", model="o3").route("openai", "gpt") == "openai/o3"
    assert AgentDefinition(name="a", provider="anthropic").route("openai", "gpt") == (
        "anthropic/claude-sonnet-4-5")


def test_an_agent_narrows_trust_and_tools_and_never_widens_them() -> None:
    msg = InboundMessage(key=key("http", "c"), text="hi", trust="guest",
                         allowed_tools=["current_time", "http_fetch"])
    operator_agent = AgentDefinition(name="a", trust="operator",
                                     allowed_tools=["http_fetch", "schedule_create"])
    out = as_agent(msg, operator_agent)
    assert out.trust == "guest"  # an operator agent does not raise a guest
    assert out.allowed_tools == ["http_fetch"]
    guest_agent = AgentDefinition(name="g", trust="guest")
    op_msg = InboundMessage(key=key("http", "c"), text="hi", trust="operator")
    assert as_agent(op_msg, guest_agent).trust == "guest"
    assert as_agent(op_msg, AgentDefinition(name="d")) is op_msg
    assert narrow_tools(None, []) == []
    assert narrow_tools(None, None) is None


def test_a_main_agents_timeout_of_zero_means_no_deadline() -> None:
    """Fased: "Explicit `0` means no practical timeout"."""
    from fermix_shared.models import ConversationKey, InboundMessage
    from fermix_worker.turn.lease import turn_deadline
    from tests.seed_text import quoted

    assert quoted("S", "Explicit `0` means no practical timeout")
    s = settings(agents=[{"name": "slow", "timeout_seconds": 0}], turn_timeout=60)
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id="c"), text="x", agent="slow")
    assert turn_deadline(msg, 0.0, s).at is None
    assert turn_deadline(msg.model_copy(update={"agent": "default"}), 0.0, s).at == 60

