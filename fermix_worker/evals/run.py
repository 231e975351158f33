"""One run of an eval case on a worker: its conversation played turn by turn through today's
loop, tools and models, then checked against its expectations (fermix_shared/evals/expect.py)
and, when it has a rubric, graded by a model (:mod:`~fermix_worker.evals.grade`).

The case runs in a scratch conversation of its own (``http|eval:<suite>|<run id>``) from the
history the case gives, with the agent's prompt and tools as a new operator turn has them
(trust ``operator``, the agent's tool policy) and without memory facts, memory files or
hooks: a case says everything its agent knows. Its model calls are metered and budgeted like
any turn's, charged to that conversation and the agent. It never waits for a person (a call
that needs approval is refused) and starts no subagents (such a call is answered with an
error); nothing is delivered to a chat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from fermix_shared import audit
from fermix_shared.agents.definitions import AgentDefinition, agent_named
from fermix_shared.errors import UserInputError
from fermix_shared.evals.expect import CalledTool, Observed, check
from fermix_shared.evals.suite import Case
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage, new_run_id
from fermix_shared.settings import Settings
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.scopes import attribution_for
from fermix_worker.approvals.policy import ApprovalPolicy
from fermix_worker.approvals.taint import TaintPolicy
from fermix_worker.evals.grade import grade
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.loop import (
    AgentLoop,
    AwaitApproval,
    AwaitSubagents,
    Failed,
    Final,
    answer_call,
)
from fermix_worker.loop_state import LoopState
from fermix_worker.providers import Router, override_route
from fermix_worker.providers.base import ModelTurn
from fermix_worker.providers.routes import chain_from_settings, route_spec
from fermix_worker.recorder.fork import Counted, usd_micros
from fermix_worker.subagents.tool import for_profile
from fermix_worker.tools.base import ToolRegistry, ToolResult
from fermix_worker.tools.context import RunContext
from fermix_worker.turn.drive import tool_scope
from fermix_worker.turn.events import NoEvents
from fermix_worker.turn.prepare import TurnInputs, prepare, prompt_base
from fermix_worker.usage.metered import charged_to

NO_APPROVALS = "denied: an eval does not wait for approvals"
NO_SUBAGENTS = "Error: an eval does not start subagents."


class EvalError(UserInputError, ValueError):
    """The case cannot run as asked (an unknown agent, a model of no known provider)."""


@dataclass(frozen=True)
class EvalRequest:
    """One run to make: ``case`` of ``suite`` on ``agent`` (and ``model``; None: the agent's
    own), graded on ``grader`` (None: the model it ran on), the ``repeat``-th time."""

    suite: str
    case: Case
    agent: str = "default"
    model: str | None = None
    grader: str | None = None
    repeat: int = 1
    actor: str = "http:api"


@dataclass
class EvalRun:
    """What the run did and whether it passed (``failures`` empty)."""

    request: EvalRequest
    run_id: str
    route: str
    seen: Observed
    failures: list[str]
    input_tokens: int = 0
    output_tokens: int = 0
    grade: dict[str, Any] | None = None
    grader_usd: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        req, seen = self.request, self.seen
        return {
            "suite": req.suite, "case": req.case.name, "agent": req.agent, "model": req.model,
            "route": self.route, "repeat": req.repeat, "runId": self.run_id,
            "passed": not self.failures, "failures": self.failures,
            "status": "ok" if seen.ok else "error", "reply": seen.reply, "error": seen.error,
            "toolCalls": [{"name": c.name, "arguments": c.arguments} for c in seen.tool_calls],
            "steps": seen.steps, "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens, "usd": round(seen.usd, 6),
            "latencyS": round(seen.latency_s, 3), "grade": self.grade,
            "graderUsd": round(self.grader_usd, 6),
        }


def _until_done(loop: AgentLoop, state: LoopState) -> Final | Failed:
    """The loop to its end, approvals refused and fan-outs answered with an error."""
    while True:
        match loop.run(state):
            case Final() | Failed() as outcome:
                return outcome
            case AwaitApproval(call=call):
                state.approvals[call.id] = NO_APPROVALS
            case AwaitSubagents(call=call):
                answer_call(state, call.id, ToolResult(NO_SUBAGENTS, is_error=True))


@dataclass(frozen=True)
class _Routes:
    """Where the case's calls go: its model's ``provider/model`` and the grader's, and the
    primary route they are compared with (a call off it is sent there explicitly)."""

    model: str
    grader: str
    primary: str

    @classmethod
    def of(cls, req: EvalRequest, settings: Settings, agent: AgentDefinition) -> _Routes:
        first = chain_from_settings(settings)[0]
        primary = f"{first.provider}/{first.model}"
        try:
            spec = (route_spec(settings, req.model) if req.model is not None
                    else agent.route(first.provider, first.model) or primary)
            return cls(spec, route_spec(settings, req.grader) if req.grader else spec, primary)
        except ValueError as e:
            raise EvalError(str(e)) from None

    def override(self, spec: str) -> str | None:
        return None if spec == self.primary else spec


def run_case(req: EvalRequest, settings: Settings, tools: ToolRegistry,
             router: Callable[[], Router], r: redis.Redis) -> EvalRun:
    """Run ``req`` (module docstring); EvalError when it cannot start."""
    agent = agent_named(settings.agents, req.agent)
    if agent is None:
        raise EvalError(f"no agent is named {req.agent!r}")
    routes = _Routes.of(req, settings, agent)
    prices = PriceCatalog(settings.prices)

    def provider(msg: InboundMessage, spec: str) -> Counted:
        routed = charged_to(router(), attribution_for(msg))
        if (override := routes.override(spec)) is not None:
            routed = routed.with_primary(override_route(settings, override))
        return Counted(routed.for_turn(sleep=time.sleep))

    run_id = new_run_id()
    key = ConversationKey(channel="http", chat_id=f"eval:{req.suite}", thread_scope=run_id)
    history = [ChatMessage(role=t.role, content=t.content) for t in req.case.history]
    seen = Observed(reply="")
    turns: list[ModelTurn] = []
    started = time.monotonic()
    for i, text in enumerate(req.case.messages):
        msg = InboundMessage(run_id=run_id if i == 0 else new_run_id(), key=key, text=text,
                             agent=agent.name, sender_id=f"eval:{req.actor}")
        calls = provider(msg, routes.model)
        outcome, state = _one_turn(msg, agent, history, routes, calls, tools, settings, r)
        turns += calls.turns
        seen.tool_calls += [CalledTool(c.name, dict(c.arguments))
                            for m in state.turn_messages() for c in m.tool_calls]
        history = [*history, *state.turn_messages()]
        if isinstance(outcome, Failed):
            seen.ok, seen.error, seen.reply = False, outcome.message, ""
            break
        seen.reply = outcome.text
    seen.latency_s = time.monotonic() - started
    seen.steps = len(turns)
    seen.usd = sum(usd_micros(prices, t) for t in turns) / 1e6
    run = EvalRun(req, run_id, routes.model, seen, check(req.case.expect, seen),
                  input_tokens=sum(t.input_tokens for t in turns),
                  output_tokens=sum(t.output_tokens for t in turns))
    rubric = req.case.expect.rubric
    if rubric is not None and seen.ok:
        got = grade(provider(msg, routes.grader), routes.grader.split("/", 1)[1], history,
                    seen.reply, rubric, req.case.reference)
        run.grade = {"passed": got.passed, "reason": got.reason, "model": routes.grader}
        run.grader_usd = usd_micros(prices, got.turn) / 1e6 if got.turn else 0.0
        if not got.passed:
            run.failures.append(f"the rubric failed: {got.reason or 'no reason given'}")
    return run


def _one_turn(msg: InboundMessage, agent: AgentDefinition, history: list[ChatMessage],
              routes: _Routes, provider: Counted, tools: ToolRegistry, settings: Settings,
              r: redis.Redis) -> tuple[Final | Failed, LoopState]:
    """One user message of the case, as a new operator turn of ``agent`` runs it."""
    state = prepare(TurnInputs(
        messages=[msg], history=history,
        prompt_base=prompt_base(agent.system_prompt or settings.system_prompt, ""), facts="",
        now=datetime.now(UTC), model=routes.model.split("/", 1)[1],
        route_override=routes.override(routes.model), agent=agent))
    offered = for_profile(tools.scoped(tool_scope(msg, agent)), msg.profile)
    loop = AgentLoop(
        provider, offered, NoEvents(), max_tokens=settings.max_tokens,
        guard=LoopGuard(GuardConfig.from_settings(settings)),
        needs_approval=ApprovalPolicy(settings.approvals).needs,
        taint_gate=TaintPolicy(settings.taint).gate,
        context=RunContext.for_turn(msg, _offers(offered),
                                    audit=audit.recorder(r, audit.who(msg), trust=msg.trust)))
    return _until_done(loop, state), state


def _offers(tools: ToolRegistry) -> Callable[[str], bool]:
    return lambda name: tools.get(name) is not None
