"""Fork: a recorded turn continued from one of its steps with another model, agent or prompt,
to see what it would have answered.

The turn's first ``step - 1`` steps are replayed as recorded (its own prompt, its recorded
responses and results; :func:`~fermix_worker.recorder.replay.run_steps` with
``strict=False``); from step ``step`` on the loop runs for real, in a scratch conversation
(``http|fork:<run id>|<fork id>``, its own run record, its calls metered like any turn's), on
the new model, agent or prompt. Tools answer from the record by default (a call the record
has, with the same name and arguments, gets its recorded result; any other call an error
saying so); with ``live_tools`` they run, narrowed to what the caller may run. A fork never
waits for a person (a call that needs approval is refused) and starts no subagents (a fan-out
the record has is answered from it). Nothing is delivered to a chat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from fermix_shared import audit
from fermix_shared import recorder as rec
from fermix_shared.agents.definitions import agent_named
from fermix_shared.errors import UserInputError
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import (
    ConversationKey,
    InboundMessage,
    RunRecord,
    RunStatus,
    Trust,
    new_run_id,
    now,
)
from fermix_shared.settings import Settings
from fermix_shared.stores import runs
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.scopes import attribution_for
from fermix_worker.approvals.policy import ApprovalPolicy
from fermix_worker.approvals.taint import TaintPolicy
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.loop import (
    AgentLoop,
    AwaitApproval,
    AwaitSubagents,
    CompletingProvider,
    Failed,
    Final,
    LoopTools,
    answer_call,
)
from fermix_worker.loop_state import LoopState
from fermix_worker.providers import Router, override_route
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ProviderState, ToolSpec
from fermix_worker.providers.routes import chain_from_settings, route_spec
from fermix_worker.recorder.replay import (
    first_state,
    replay_loop,
    run_steps,
    turn_tools,
)
from fermix_worker.tools.base import Tool, ToolRegistry, ToolResult
from fermix_worker.tools.context import RunContext
from fermix_worker.turn.drive import tool_scope
from fermix_worker.turn.events import NoEvents
from fermix_worker.usage.metered import charged_to

NO_RECORDED_RESULT = (
    "Error: this fork answers tool calls from the original run's record, which has no call "
    "of {name} with these arguments (fork with live tools to run it)."
)
NO_APPROVALS = "denied: a fork does not wait for approvals"
NO_SUBAGENTS = ("Error: a fork does not start subagents, and the original run's record has no "
                "result for this call.")


class ForkError(UserInputError, ValueError):
    """The fork cannot start (the sentence says why)."""


@dataclass(frozen=True)
class ForkOptions:
    """What to fork onto: ``step`` (1 first), and any of ``model`` (``provider/model`` or a
    model of the configured provider), ``agent`` (a declared agent) and ``prompt`` (a whole
    system prompt); ``live_tools`` runs tools for ``trust`` (the caller's)."""

    step: int = 1
    model: str | None = None
    agent: str | None = None
    prompt: str | None = None
    live_tools: bool = False
    trust: Trust = "operator"
    actor: str = "http:api"


@dataclass
class Side:
    """One column of the comparison."""

    run_id: str
    label: str
    reply: str
    status: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    usd_micros: int = 0
    models: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"runId": self.run_id, "label": self.label, "reply": self.reply,
                "status": self.status, "toolCalls": [c.model_dump() for c in self.tool_calls],
                "inputTokens": self.input_tokens, "outputTokens": self.output_tokens,
                "usdMicros": self.usd_micros, "usd": round(self.usd_micros / 1e6, 6),
                "models": self.models}


@dataclass
class ForkReport:
    step: int
    original: Side
    fork: Side

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "original": self.original.as_json(),
                "fork": self.fork.as_json()}


class Counted:
    """The fork's provider, keeping what each call answered (for its column)."""

    def __init__(self, inner: CompletingProvider):
        self._inner = inner
        self.turns: list[ModelTurn] = []

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        turn = self._inner.chat(request, on_delta)
        self.turns.append(turn)
        return turn

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        turn = self._inner.continue_(provider_state, tool_results, opts, on_delta)
        self.turns.append(turn)
        return turn


class RecordedTools:
    """Today's tools as the model sees them; each call answered from the record when it has
    the same call (by name and arguments, each recorded result used once), else an error."""

    def __init__(self, inner: LoopTools, recording: rec.Recording):
        self._inner = inner
        answers = list(recording.tools.values())
        if recording.end is not None:
            answers += [a for k, a in recording.end.answers.items() if k not in recording.tools]
        self._unused = answers

    def specs(self) -> list[ToolSpec]:
        return self._inner.specs()

    def get(self, name: str) -> Tool | None:
        return self._inner.get(name)

    def take(self, call: ToolCall) -> rec.ToolRun | None:
        for i, found in enumerate(self._unused):
            if (found.call.name, found.call.arguments) == (call.name, call.arguments):
                return self._unused.pop(i)
        return None

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult:
        found = self.take(call)
        if found is None:
            return ToolResult(NO_RECORDED_RESULT.format(name=call.name), is_error=True)
        return ToolResult(found.content, found.is_error)


def _lower(a: Trust, b: Trust) -> Trust:
    return "guest" if "guest" in (a, b) else "operator"


def fork(recording: rec.Recording, settings: Settings, tools: ToolRegistry,
         router: Callable[[], Router], r: redis.Redis, opts: ForkOptions) -> ForkReport:
    """Fork the recorded turn (module docstring); raises ForkError with a sentence."""
    start = recording.start
    if start is None:
        raise ForkError(f"run {recording.run_id}'s record has no start; it cannot be forked")
    if opts.step < 1:
        raise ForkError("the step to fork from is 1 or more")
    state = first_state(start, settings, as_recorded=True)
    offered = turn_tools(tools, start, settings)
    _replay_before(recording, state, offered, settings, opts.step)
    calls_before = state.iteration
    original = _original(recording, opts.step, calls_before, settings)
    fork_id = new_run_id()
    msg = start.messages[0]
    scratch = msg.model_copy(update={
        "run_id": fork_id, "key": ConversationKey(channel="http",
                                                  chat_id=f"fork:{recording.run_id}",
                                                  thread_scope=fork_id),
        "trust": _lower(msg.trust, opts.trust), "deliver_to": None,
    })
    label = _retarget(state, opts, settings, start)
    if opts.agent is not None:
        chosen = agent_named(settings.agents, opts.agent)
        assert chosen is not None
        offered = turn_tools(tools, start, settings, chosen)
        scratch = scratch.model_copy(update={"agent": chosen.name})
    state.run_id = fork_id
    routed = charged_to(router(), attribution_for(scratch))
    if state.route_override:
        routed = routed.with_primary(override_route(settings, state.route_override))
    provider = Counted(routed.for_turn(sleep=time.sleep))
    loop_tools, context = _fork_tools(opts, offered, scratch, recording, r)
    record = RunRecord(run_id=fork_id, conversation=scratch.key, status=RunStatus.running,
                       started_at=now(), worker="fork")
    runs.put(r, record)
    loop = AgentLoop(
        provider, loop_tools, NoEvents(), max_tokens=settings.max_tokens,
        guard=LoopGuard(GuardConfig.from_settings(settings)),
        needs_approval=ApprovalPolicy(settings.approvals).needs,
        taint_gate=TaintPolicy(settings.taint).gate, context=context)
    outcome = _run(loop, state, loop_tools)
    reply = outcome.text if isinstance(outcome, Final) else outcome.message
    record.status = RunStatus.ok if isinstance(outcome, Final) else RunStatus.error
    record.ended_at = now()
    record.reply = reply if isinstance(outcome, Final) else None
    record.error = None if isinstance(outcome, Final) else outcome.message
    runs.put(r, record)
    fork_side = Side(fork_id, label, reply, record.status.value)
    for m in state.messages[len(state.messages) - _added(state, calls_before):]:
        fork_side.tool_calls += m.tool_calls
    prices = PriceCatalog(settings.prices)
    for turn in provider.turns:
        fork_side.input_tokens += turn.input_tokens
        fork_side.output_tokens += turn.output_tokens
        fork_side.usd_micros += usd_micros(prices, turn)
        fork_side.models.append(turn.model or turn.route_model)
    return ForkReport(opts.step, original, fork_side)


def _fork_tools(opts: ForkOptions, offered: ToolRegistry, scratch: InboundMessage,
                recording: rec.Recording, r: redis.Redis) -> tuple[LoopTools, RunContext]:
    """The fork's tools and their context: live ones narrowed to the caller (audited), or
    the record's answers."""
    if not opts.live_tools:
        return RecordedTools(offered, recording), RunContext()
    live = offered.scoped(tool_scope(scratch))
    return live, RunContext.for_turn(scratch, lambda name: live.get(name) is not None,
                                     audit=audit.recorder(r, audit.who(scratch),
                                                          trust=scratch.trust))


def _replay_before(recording: rec.Recording, state: LoopState, offered: ToolRegistry,
                   settings: Settings, step: int) -> None:
    """Step ``state`` through the record up to the fork point; ForkError when those steps
    do not replay or the run ended before it."""
    if step == 1:
        return
    done = run_steps(recording, state, replay_loop(recording, state, offered, settings,
                                                   strict=False), up_to=step - 1)
    if done.divergence is not None:
        d = done.divergence
        raise ForkError(f"the run's steps before step {step} do not replay from its record "
                        f"(step {d.step}: {d.what})")
    if done.outcome is not None:
        raise ForkError(f"the run ended at step {len(done.steps)}; fork from step "
                        f"{len(done.steps)} or before")


def usd_micros(prices: PriceCatalog, turn: ModelTurn) -> int:
    """What one answered call cost, priced as the meter prices it (a fork's or an eval's)."""
    return prices.price((turn.route_model, turn.model), turn.input_tokens, turn.output_tokens,
                        cache_read=turn.cache_read_tokens,
                        cache_write=turn.cache_write_tokens).usd_micros


def _added(state: LoopState, calls_before: int) -> int:
    """How many of the state's messages the fork added (its assistant and tool messages
    since the fork point)."""
    assistants = [i for i, m in enumerate(state.messages) if m.role == "assistant"]
    turn_assistants = [i for i in assistants if i >= state.turn_start]
    if len(turn_assistants) <= calls_before:
        return 0
    return len(state.messages) - turn_assistants[calls_before]


def _retarget(state: LoopState, opts: ForkOptions, settings: Settings,
              start: rec.Start) -> str:
    """Point the state at the fork's model, agent or prompt; the fork's label."""
    parts = []
    primary = chain_from_settings(settings)[0]
    if opts.agent is not None:
        chosen = agent_named(settings.agents, opts.agent)
        if chosen is None:
            raise ForkError(f"no agent is named {opts.agent!r}")
        state.system = first_state(start, settings, agent=chosen).system
        state.agent, state.temperature = chosen.name, chosen.temperature
        if (route := chosen.route(primary.provider, primary.model)) is not None:
            state.route_override, state.model = route, route.split("/", 1)[1]
        parts.append(f"agent {chosen.name}")
    if opts.prompt is not None:
        if not opts.prompt.strip():
            raise ForkError("the fork's prompt is empty")
        state.system = opts.prompt
        parts.append(f"prompt of {len(opts.prompt)} characters")
    if opts.model is not None:
        try:
            spec = route_spec(settings, opts.model)
        except ValueError as e:
            raise ForkError(str(e)) from None
        state.route_override, state.model = spec, spec.split("/", 1)[1]
        parts.append(f"model {spec}")
    if not parts:
        raise ForkError("a fork needs a model, an agent or a prompt to differ by")
    state.route, state.provider_state, state.final = None, None, None
    return ", ".join(parts)


def _run(loop: AgentLoop, state: LoopState, tools: LoopTools) -> Final | Failed:
    """The loop from the fork point to its end: approvals refused, fan-outs answered from the
    record."""
    while True:
        outcome = loop.run(state)
        match outcome:
            case Final() | Failed():
                return outcome
            case AwaitApproval(call=call):
                state.approvals[call.id] = NO_APPROVALS
            case AwaitSubagents(call=call):
                found = tools.take(call) if isinstance(tools, RecordedTools) else None
                answer_call(state, call.id, ToolResult(found.content, found.is_error)
                            if found else ToolResult(NO_SUBAGENTS, is_error=True))


def _original(recording: rec.Recording, step: int, calls_before: int,
              settings: Settings) -> Side:
    """The original run's column, from the fork point on."""
    end = recording.end
    side = Side(recording.run_id, f"original, from step {step}",
                end.reply if end else "", "ok" if end and end.outcome == "final" else "error")
    prices = PriceCatalog(settings.prices)
    for i in sorted(recording.calls):
        call = recording.calls[i]
        if i < calls_before or call.response is None:
            continue
        resp = call.response
        side.tool_calls += resp.tool_calls
        side.input_tokens += resp.input_tokens
        side.output_tokens += resp.output_tokens
        side.usd_micros += prices.price(
            (resp.route_model, resp.model), resp.input_tokens, resp.output_tokens,
            cache_read=resp.cache_read_tokens, cache_write=resp.cache_write_tokens,
            when=call.at).usd_micros
        side.models.append(resp.model or resp.route_model)
    return side
