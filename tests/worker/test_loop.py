"""AgentLoop as plain Python: a provider that replays scripted model turns, real tools."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from fermix_shared.errors import ProviderRateLimited, ProviderUnavailable
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.loop import (
    INTERRUPTED_TOOL,
    ITERATION_CAP_MESSAGE,
    AgentLoop,
    Failed,
    Final,
    RunAgain,
    turn_text,
)
from fermix_worker.loop_state import LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, Resending
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry, ToolResult
from fermix_worker.turn.close import final_history
from tests.seed_text import quoted


@dataclass
class ReplayProvider(Resending):
    """Returns the queued turns (or raises the queued errors) in order."""

    turns: list[ModelTurn | Exception]
    name: str = "replay"
    requests: list[ModelRequest] = field(default_factory=list)
    initial: list[bool] = field(default_factory=list)

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool = False) -> ModelTurn:
        # The loop passes its live message list: keep what this call saw.
        self.requests.append(dataclasses.replace(request, messages=list(request.messages)))
        self.initial.append(initial)
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
    diagnostics: list[tuple[str, dict[str, object]]] = field(default_factory=list)

    def assistant_delta(self, text: str) -> None:
        self.deltas.append(text)

    def tool_start(self, call: ToolCall) -> None:
        self.tools.append(("start", call.name))

    def tool_update(self, call: ToolCall, text: str) -> None:
        self.tools.append(("update", text))

    def tool_result(self, call: ToolCall, result: ToolResult) -> None:
        self.tools.append(("error" if result.is_error else "result", result.content))

    def diagnostic(self, kind: str, **data: object) -> None:
        self.diagnostics.append((kind, data))

    def thinking(self, text: str) -> None:
        self.diagnostics.append(("thinking", {"text": text}))


def state(text: str = "hi", **kw: object) -> LoopState:
    return LoopState(run_id="r1", model="m", system="sys",
                     messages=[ChatMessage(role="user", content=text)], turn_start=0, **kw)


def calc(expr: str, call_id: str = "c1") -> ModelTurn:
    return ModelTurn("", [ToolCall(id=call_id, name="calculator", arguments={"expression": expr})])


def loop(provider: ReplayProvider, rec: Recorder | None = None, **kw: Any) -> AgentLoop:
    return AgentLoop(provider, ToolRegistry(BUILTIN_TOOLS), rec or Recorder(), **kw)


def test_plain_text_is_final_and_streamed() -> None:
    rec = Recorder()
    st = state()
    out = loop(ReplayProvider([ModelTurn("hello there", [], 5, 2)]), rec).run(st)
    assert out == Final("hello there")
    assert rec.deltas == ["hello", "there"]
    assert st.iteration == 1 and st.usage.input_tokens == 5 and st.usage.output_tokens == 2


def test_a_tool_call_runs_the_tool_and_feeds_the_result_back() -> None:
    provider = ReplayProvider([calc("2**10"), ModelTurn("It is 1024.", [])])
    rec, st = Recorder(), state("what is 2**10")
    checkpoints: list[tuple[int, dict[str, str]]] = []
    out = loop(provider, rec, checkpoint=lambda s: checkpoints.append((s.iteration, dict(s.journal)))).run(st)
    assert out == Final("It is 1024.")
    assert rec.tools == [("start", "calculator"), ("result", "2**10 = 1024")]
    # Checkpointed after every step, and as a tool starts (its journal entry says so).
    assert checkpoints == [(1, {}), (1, {"c1": "started"}), (1, {"c1": "done"}), (2, {"c1": "done"})]
    assert provider.initial == [True, False], "only the turn's first call may fail over"
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
    assert loop(ReplayProvider(turns), rec).run(state()) == Final("Sorry.")
    assert rec.tools[1] == ("error", "Error: only numbers and + - * / // % ** ( ) are allowed")
    assert rec.tools[3] == ("error", "Error: unknown tool 'rm_rf'")


def test_the_iteration_cap_ends_the_turn_with_the_seed_message() -> None:
    provider = ReplayProvider([calc("1+1")])
    st = state(max_iterations=3)
    out = loop(provider).run(st)
    assert out == Failed(ITERATION_CAP_MESSAGE, "3 iterations")
    assert ITERATION_CAP_MESSAGE.startswith("I hit the investigation step limit before finishing")
    assert len(provider.requests) == 3


def test_step_returns_the_next_step() -> None:
    provider = ReplayProvider([calc("1+1"), ModelTurn("2", [])])
    st, lp = state(), loop(provider)
    assert lp.step(st) == RunAgain()  # the model asked for a tool
    assert lp.step(st) == RunAgain()  # the tool ran: its own step, checkpointed on its own
    assert lp.step(st) == Final("2")


def test_provider_errors_become_user_messages() -> None:
    limited = ProviderRateLimited("429", provider="anthropic", retry_after=300)
    out = loop(ReplayProvider([limited])).run(state())
    assert out == Failed("You’ve hit your anthropic usage limit. Try again in ~5 min.", "429")
    down = ProviderUnavailable("could not connect to openai: refused", provider="openai")
    out = loop(ReplayProvider([down])).run(state())
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


def test_an_empty_reply_after_a_side_effect_closes_silently_with_a_marker() -> None:
    from fermix_worker.tools import Tool
    from fermix_worker.turn.close import final_history, reply_text

    react = Tool("react", "add an emoji reaction", {"type": "object"}, lambda ctx, a: "reacted",
                 delivers="reaction")
    provider = ReplayProvider([ModelTurn("", [ToolCall(id="r", name="react")]), ModelTurn("", [])])
    st = state()
    out = AgentLoop(provider, ToolRegistry([react]), Recorder()).run(st)
    assert out == Final("") and st.side_effects == ["reaction"]
    committed = final_history(st, "")
    assert committed[-1].content == "[replied with reaction]"
    assert reply_text(committed, st) is None
    # Without a side effect an empty completion commits nothing.
    plain = state()
    AgentLoop(ReplayProvider([ModelTurn("", [])]), ToolRegistry([]), Recorder()).run(plain)
    assert final_history(plain, "") == []


@pytest.mark.parametrize(
    ("context", "cap"),
    [("interactive", 100), ("subagent", 100), ("scheduled", 100), ("ultra_subagent", 40)],
)
def test_iteration_caps_by_context(context: Any, cap: int) -> None:
    st = LoopState.start(run_id="r", model="m", system="s", history=[],
                         user=ChatMessage(role="user", content="x"), context=context)
    assert st.max_iterations == cap
    provider = ReplayProvider([calc("1+1")])
    # distinct arguments each time so the loop guard does not fire first
    provider.turns = [calc(f"{i}+1", f"c{i}") for i in range(cap + 1)]
    assert loop(provider, guard=LoopGuard(GuardConfig(max_tool_calls=1000))).run(st) == Failed(
        ITERATION_CAP_MESSAGE, f"{cap} iterations")
    assert len(provider.requests) == cap


def test_a_repeated_call_warns_once_in_the_next_continuation_then_kills_at_five() -> None:
    provider = ReplayProvider([calc("2+2", f"c{i}") for i in range(6)])
    rec = Recorder()
    out = loop(provider, rec).run(state())
    assert isinstance(out, Failed)
    assert out.message == "Repeated tool call loop detected: calculator was called 5 times with the same arguments."
    warning = ("Repeated tool call warning: calculator was called 3 times with the same arguments. "
               "Do not call it again unless the arguments or plan meaningfully change.")
    # Threaded into the continuation after the 3rd call, and only that one.
    seen = [warning in req.messages[-1].content for req in provider.requests]
    assert seen == [False, False, False, True, False]
    assert ("loop_guard", {"message": warning}) in rec.diagnostics


def test_a_same_tool_streak_of_five_injects_openfangs_notice_as_a_system_message() -> None:
    notice = quoted("O", "**LOOP DETECTED**: You have called the same tool 5 times in a row. "
                         "Consider a different approach or provide a final answer.")
    turns = [calc(f"{i}+1", f"c{i}") for i in range(5)]
    provider = ReplayProvider([*turns, ModelTurn("done", [])])
    st = state()
    assert loop(provider).run(st) == Final("done")
    sixth = provider.requests[5].messages
    # After the fifth result, one system message with the seed's words, before the model call.
    assert [m.role for m in sixth[-2:]] == ["tool", "system"]
    assert sixth[-1].content == notice
    assert not any(m.role == "system" for r in provider.requests[:5] for m in r.messages)
    # The tool result itself is the tool's, untouched.
    assert sixth[-2].content == "4+1 = 5"
    # A notice to the model, never history: the committed turn holds no system message.
    assert "system" not in [m.role for m in final_history(st, "done")]


def test_arguments_written_in_another_key_order_count_as_a_repeat() -> None:
    def call(args: dict[str, str], i: int) -> ModelTurn:
        return ModelTurn("", [ToolCall(id=f"t{i}", name="current_time", arguments=args)])

    provider = ReplayProvider([call({"timezone": "UTC", "x": "1"} if i % 2 else {"x": "1", "timezone": "UTC"}, i)
                               for i in range(6)])
    out = loop(provider).run(state())
    assert isinstance(out, Failed) and out.message.startswith("Repeated tool call loop detected")


def test_a_resumed_turn_never_reruns_a_non_idempotent_tool_that_had_started() -> None:
    from fermix_worker.tools import Tool

    runs: list[str] = []
    send = Tool("send_email", "send", {"type": "object"},
                lambda ctx, a: runs.append("sent") or "sent",
                policy="external_api", idempotent=False)
    st = state()
    st.messages.append(ChatMessage(role="assistant", tool_calls=[ToolCall(id="e1", name="send_email")]))
    st.journal["e1"] = "started"  # the worker died while it ran
    provider = ReplayProvider([ModelTurn("I could not confirm the email.", [])])
    out = AgentLoop(provider, ToolRegistry([send]), Recorder()).run(st)
    assert out == Final("I could not confirm the email.")
    assert runs == []
    assert st.messages[-2].content == INTERRUPTED_TOOL and st.messages[-2].is_error


def test_a_resumed_turn_reruns_an_idempotent_tool_that_had_started() -> None:
    st = state()
    st.messages.append(ChatMessage(role="assistant", tool_calls=[
        ToolCall(id="c1", name="calculator", arguments={"expression": "3*3"})]))
    st.journal["c1"] = "started"
    st.iteration = 1
    provider = ReplayProvider([ModelTurn("9", [])])
    assert loop(provider).run(st) == Final("9")
    assert st.messages[-2].content == "3*3 = 9"
    assert provider.initial == [False], "a resumed turn's continuation never fails over"


def test_a_turn_whose_tool_failed_and_said_nothing_gets_a_fallback_reply() -> None:
    from fermix_worker.turn.reply import EMPTY_COMPLETION, empty_turn_reply

    provider = ReplayProvider([calc("1/0"), ModelTurn("", [])])
    st = state()
    loop(provider).run(st)
    assert st.tool_failures == ["calculator: division by zero"]
    assert empty_turn_reply(st.tool_failures) == "A tool failed and I couldn't finish that: calculator: division by zero"
    assert empty_turn_reply([]) == EMPTY_COMPLETION


def test_before_tool_call_hooks_can_rewrite_or_block() -> None:
    from fermix_shared.hooks import HookRegistry

    class Rewrite:
        def before_tool_call(self, payload: dict[str, Any]) -> dict[str, Any]:
            if payload["arguments"].get("expression") == "forbidden":
                return {"block": "not allowed here"}
            return {"arguments": {"expression": "10*10"}}

    hooks = HookRegistry()
    hooks.register("rewrite", Rewrite())
    rec = Recorder()
    provider = ReplayProvider([calc("1+1", "a"), calc("forbidden", "b"), ModelTurn("ok", [])])
    loop(provider, rec, hooks=hooks).run(state())
    assert rec.tools[1] == ("result", "10*10 = 100")
    assert rec.tools[3] == ("error", "Error: this tool call was blocked: not allowed here")


def test_a_long_tool_reports_progress_as_update_events_throttled() -> None:
    from fermix_worker.tools import RunContext, Tool
    from fermix_worker.tools.progress import MIN_INTERVAL_S

    clock = [0.0]

    def build(ctx: RunContext, args: dict[str, Any]) -> str:
        for step in ("compiling", "linking", "testing"):
            clock[0] += MIN_INTERVAL_S  # each report lands after the interval...
            ctx.report(step)
        ctx.report("too soon")  # ...but this one comes at once after the last: dropped
        return "built"

    tool = Tool("build", "Build it.", {"type": "object", "properties": {}}, build)
    provider = ReplayProvider([ModelTurn("", [ToolCall(id="b1", name="build", arguments={})]),
                               ModelTurn("Done.", [])])
    rec = Recorder()
    import fermix_worker.tools.progress as progress

    real = progress.time.monotonic
    progress.time.monotonic = lambda: clock[0] + 1000.0  # type: ignore[assignment]
    try:
        AgentLoop(provider, ToolRegistry([tool]), rec).run(state("build it"))
    finally:
        progress.time.monotonic = real  # type: ignore[assignment]
    assert rec.tools == [("start", "build"), ("update", "compiling"), ("update", "linking"),
                         ("update", "testing"), ("result", "built")]
    RunContext().report("outside any call")  # no reporter: a no-op, never an error


def test_the_streamed_deltas_add_up_to_the_reply_on_a_tool_turn() -> None:
    class Whole(ReplayProvider):
        def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool = False) -> ModelTurn:
            nxt = self.turns.pop(0)
            assert isinstance(nxt, ModelTurn)
            if nxt.content:
                on_delta(nxt.content)
            return nxt

    steps = [ModelTurn("Checking.", [ToolCall(id="c1", name="calculator", arguments={"expression": "1+1"})]),
             ModelTurn("", [ToolCall(id="c2", name="calculator", arguments={"expression": "2+2"})]),
             ModelTurn("It is 4.", [])]
    rec, st = Recorder(), state()
    out = loop(Whole(list(steps)), rec).run(st)
    assert out == Final("It is 4.")
    assert "".join(rec.deltas) == turn_text(st, "It is 4.") == "Checking.\n\nIt is 4."


def test_each_iteration_logs_openfangs_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="fermix_worker.loop")
    loop(ReplayProvider([calc("1+1"), ModelTurn("2", [], 7, 3)])).run(state(agent="ops"))
    lines = [r.getMessage() for r in caplog.records if r.name == "fermix_worker.loop"]
    assert quoted("O", '"Agent loop iteration complete"')
    assert lines[-1] == "Agent loop iteration complete: agent=ops iteration=2 tokens=10"
    assert len(lines) == 2
