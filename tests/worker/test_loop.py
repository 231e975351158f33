"""AgentLoop as plain Python: a provider that replays scripted model turns, real tools."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from fermix_shared.errors import ProviderRateLimited, ProviderUnavailable
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.loop import (
    ITERATION_CAP_MESSAGE,
    AgentLoop,
    Failed,
    Final,
    LoopState,
    RunAgain,
)
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry, ToolResult
from fermix_worker.turn import shape_reply


@dataclass
class ReplayProvider:
    """Returns the queued turns (or raises the queued errors) in order."""

    turns: list[ModelTurn | Exception]
    name: str = "replay"
    requests: list[ModelRequest] = field(default_factory=list)

    def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        self.requests.append(request)
        nxt = self.turns.pop(0) if len(self.turns) > 1 else self.turns[0]
        if isinstance(nxt, Exception):
            raise nxt
        for word in nxt.content.split(" "):
            on_delta(word)
        return nxt


@dataclass
class Recorder:
    deltas: list[str] = field(default_factory=list)
    tools: list[tuple[str, str]] = field(default_factory=list)

    def assistant_delta(self, text: str) -> None:
        self.deltas.append(text)

    def tool_start(self, call: ToolCall) -> None:
        self.tools.append(("start", call.name))

    def tool_result(self, call: ToolCall, result: ToolResult) -> None:
        self.tools.append(("error" if result.is_error else "result", result.content))


def state(text: str = "hi", **kw: object) -> LoopState:
    return LoopState(run_id="r1", model="m", system="sys",
                     messages=[ChatMessage(role="user", content=text)], turn_start=0, **kw)


def calc(expr: str, call_id: str = "c1") -> ModelTurn:
    return ModelTurn("", [ToolCall(id=call_id, name="calculator", arguments={"expression": expr})])


def loop(provider: ReplayProvider, rec: Recorder | None = None) -> AgentLoop:
    return AgentLoop(provider, ToolRegistry(BUILTIN_TOOLS), rec or Recorder())


def test_plain_text_is_final_and_streamed() -> None:
    rec = Recorder()
    st = state()
    out = loop(ReplayProvider([ModelTurn("hello there", [], 5, 2)]), rec).run(st, lambda s: None)
    assert out == Final("hello there")
    assert rec.deltas == ["hello", "there"]
    assert st.iteration == 1 and st.usage.input_tokens == 5 and st.usage.output_tokens == 2


def test_a_tool_call_runs_the_tool_and_feeds_the_result_back() -> None:
    provider = ReplayProvider([calc("2**10"), ModelTurn("It is 1024.", [])])
    rec, st = Recorder(), state("what is 2**10")
    checkpoints: list[int] = []
    out = loop(provider, rec).run(st, lambda s: checkpoints.append(s.iteration))
    assert out == Final("It is 1024.")
    assert rec.tools == [("start", "calculator"), ("result", "2**10 = 1024")]
    assert checkpoints == [1, 2], "state is checkpointed after every step"
    roles = [m.role for m in st.turn_messages()]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert provider.requests[1].messages[2].content == "2**10 = 1024"


def test_tool_failures_and_unknown_tools_become_error_results() -> None:
    turns: list[ModelTurn | Exception] = [
        ModelTurn("", [ToolCall(id="a", name="calculator", arguments={"expression": "__import__('os')"}),
                       ToolCall(id="b", name="rm_rf", arguments={})]),
        ModelTurn("Sorry.", []),
    ]
    rec = Recorder()
    assert loop(ReplayProvider(turns), rec).run(state(), lambda s: None) == Final("Sorry.")
    assert rec.tools[1] == ("error", "Error: only numbers and + - * / // % ** ( ) are allowed")
    assert rec.tools[3] == ("error", "Error: unknown tool 'rm_rf'")


def test_the_iteration_cap_ends_the_turn_with_the_seed_message() -> None:
    provider = ReplayProvider([calc("1+1")])
    st = state(max_iterations=3)
    out = loop(provider).run(st, lambda s: None)
    assert out == Failed(ITERATION_CAP_MESSAGE, "3 iterations")
    assert ITERATION_CAP_MESSAGE.startswith("I hit the investigation step limit before finishing")
    assert len(provider.requests) == 3


def test_step_returns_the_next_step() -> None:
    provider = ReplayProvider([calc("1+1"), ModelTurn("2", [])])
    st, lp = state(), loop(provider)
    assert lp.step(st) == RunAgain()
    assert lp.step(st) == Final("2")


def test_provider_errors_become_user_messages() -> None:
    limited = ProviderRateLimited("429", provider="anthropic", retry_after=300)
    out = loop(ReplayProvider([limited])).run(state(), lambda s: None)
    assert out == Failed("You’ve hit your anthropic usage limit. Try again in ~5 min.", "429")
    down = ProviderUnavailable("could not connect to openai: refused", provider="openai")
    out = loop(ReplayProvider([down])).run(state(), lambda s: None)
    assert isinstance(out, Failed)
    assert out.message == "I couldn't reach the model provider (openai): could not connect to openai: refused"


def test_loop_state_round_trips_and_refuses_unknown_versions() -> None:
    st = state()
    st.messages.append(ChatMessage(role="assistant", tool_calls=[ToolCall(id="x", name="n")]))
    again = LoopState.model_validate_json(st.model_dump_json())
    assert again == st
    raw = st.model_dump()
    raw["schema_version"] = 99
    with pytest.raises(ValidationError, match="schema_version 99"):
        LoopState.model_validate(raw)


@pytest.mark.parametrize(
    ("text", "shown"),
    [("NO_REPLY", ""), ("no_reply", ""), ("Done. NO_REPLY", "Done."), ("hello", "hello")],
)
def test_the_silent_token_never_reaches_the_user(text: str, shown: str) -> None:
    assert shape_reply(text) == shown


def test_an_empty_reply_after_a_side_effect_closes_silently_with_a_marker() -> None:
    from fermix_worker.tools import Tool
    from fermix_worker.turn import TurnRunner

    react = Tool("react", "add an emoji reaction", {"type": "object"}, lambda a: "reacted",
                 delivers="reaction")
    provider = ReplayProvider([ModelTurn("", [ToolCall(id="r", name="react")]), ModelTurn("", [])])
    st = state()
    out = AgentLoop(provider, ToolRegistry([react]), Recorder()).run(st, lambda s: None)
    assert out == Final("") and st.side_effects == ["reaction"]
    committed = TurnRunner._final_history(st, "")
    assert committed[-1].content == "[replied with reaction]"
    assert TurnRunner._reply_text(committed, st) is None
    # Without a side effect an empty completion commits nothing.
    plain = state()
    AgentLoop(ReplayProvider([ModelTurn("", [])]), ToolRegistry([]), Recorder()).run(plain, lambda s: None)
    assert TurnRunner._final_history(plain, "") == []
