"""Replay: a recorded turn run again by today's loop, against its recorded responses and
results, to prove it reproduces or to name the first step where it does not.

The first state is rebuilt from the record's :class:`~fermix_shared.recorder.Start` with
today's configuration of the prompt (the agent's system prompt; the rest, history, facts,
skills, the clock, is the record's), and the loop steps through it with stand-ins
(:mod:`~fermix_worker.recorder.standins`): a :class:`ReplayProvider` that compares each request the loop makes with the one recorded under
the same call index and answers with the recorded response, and :class:`ReplayTools` that
compare each call with the recorded one and answer with its recorded result. No model is
called, no tool runs, nothing is written or delivered. The approvals' answers and the
fan-outs' merged results come from the record's :class:`~fermix_shared.recorder.End`.

A step is one unit of the loop's work, as :meth:`~fermix_worker.loop.AgentLoop.step` counts
it: one model call or one tool call. A divergence names the step, what differs, and both
sides (a changed prompt, a tool schema, a loop change in what it sends).

:func:`run_steps` is the engine; ``strict=False`` (a fork's first steps) answers by index and
call id without comparing requests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from fermix_shared import recorder as rec
from fermix_shared.agents.definitions import AgentDefinition, turn_agent
from fermix_shared.messages import ToolCall
from fermix_shared.settings import Settings
from fermix_worker.approvals.policy import ApprovalPolicy
from fermix_worker.approvals.taint import TaintPolicy
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.loop import (
    AgentLoop,
    AwaitApproval,
    AwaitSubagents,
    Failed,
    Final,
    LoopTools,
    RunAgain,
    answer_call,
    pending_calls,
)
from fermix_worker.loop_state import LoopState, turn_text
from fermix_worker.recorder.standins import (
    Diverged,
    ReplayProvider,
    ReplayTools,
    excerpt,
    recorded_json,
    recorded_result,
)
from fermix_worker.subagents.tool import for_profile
from fermix_worker.tools.base import ToolRegistry, ToolResult
from fermix_worker.turn.drive import tool_scope
from fermix_worker.turn.events import NoEvents
from fermix_worker.turn.prepare import PromptOverride, TurnInputs, prepare, prompt_base

StepKind = Literal["model", "tool"]


@dataclass(frozen=True)
class Step:
    """One replayed step: its number (1 first), kind and what it did."""

    n: int
    kind: StepKind
    summary: str
    tool_calls: list[ToolCall] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"step": self.n, "kind": self.kind, "summary": self.summary,
                "toolCalls": [c.model_dump() for c in self.tool_calls]}


@dataclass(frozen=True)
class Divergence:
    step: int
    kind: str
    what: str
    recorded: str = ""
    now: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "what": self.what,
                "recorded": self.recorded, "now": self.now}


@dataclass
class Replayed:
    """Where :func:`run_steps` left the turn: its state, the steps it took, and how it ended
    (a divergence, the loop's outcome, or the step it was asked to stop after)."""

    state: LoopState
    steps: list[Step]
    divergence: Divergence | None = None
    outcome: Final | Failed | None = None
    stopped_after: int | None = None


# -- the first state ------------------------------------------------------------------------


def first_state(start: rec.Start, settings: Settings, *, as_recorded: bool = False,
                agent: AgentDefinition | None = None) -> LoopState:
    """The turn's first state, rebuilt from its start with today's prompt (``as_recorded``:
    the prompt the turn had; ``agent``: another agent's)."""
    msg = start.messages[0]
    chosen = agent or turn_agent(settings.agents, msg.agent)
    system = start.system_prompt if as_recorded and agent is None else (
        chosen.system_prompt or settings.system_prompt)
    inputs = TurnInputs(
        messages=start.messages, history=start.history,
        prompt_base=prompt_base(system, start.memory_files), facts=start.facts,
        now=datetime.fromtimestamp(start.now, UTC), model=start.model,
        route_override=start.route_override,
        prompt=PromptOverride(start.prompt_system, start.prompt_prepend), skills=start.skills,
        agent=chosen)
    return prepare(inputs)


def turn_tools(tools: ToolRegistry, start: rec.Start, settings: Settings,
               agent: AgentDefinition | None = None) -> ToolRegistry:
    """The tools the turn was offered, as today's registry offers them."""
    msg = start.messages[0]
    return for_profile(tools.scoped(tool_scope(msg, agent or turn_agent(settings.agents,
                                                                        msg.agent))),
                       msg.profile)


# -- the engine ------------------------------------------------------------------------------


def replay_loop(recording: rec.Recording, state: LoopState, tools: LoopTools,
                settings: Settings, *, strict: bool = True,
                mask: Callable[[str], str] = lambda text: text) -> AgentLoop:
    """The loop over the record's stand-ins, with today's guard and policies."""
    provider = ReplayProvider(recording, state, strict=strict, mask=mask)
    return AgentLoop(
        provider, ReplayTools(tools, recording), NoEvents(), max_tokens=settings.max_tokens,
        guard=LoopGuard(GuardConfig.from_settings(settings)), inject=provider.injected,
        needs_approval=ApprovalPolicy(settings.approvals).needs,
        taint_gate=TaintPolicy(settings.taint).gate)


def _summary(state: LoopState, kind: StepKind, before: int) -> tuple[str, list[ToolCall]]:
    """What the step just taken did, from the messages it added."""
    added = state.messages[before:]
    if kind == "model":
        said = next((m for m in reversed(added) if m.role == "assistant"), None)
        if said is None:
            return "model call", []
        if said.tool_calls:
            names = ", ".join(c.name for c in said.tool_calls)
            return f"model asks for {len(said.tool_calls)} tool call(s): {names}", \
                list(said.tool_calls)
        return f"model replies ({len(said.content)} characters)", []
    answer = next((m for m in added if m.role == "tool"), None)
    if answer is None:
        return "tool call", []
    outcome = "error" if answer.is_error else "ok"
    return f"{answer.tool_name} → {outcome} ({len(answer.content)} characters)", []


def run_steps(recording: rec.Recording, state: LoopState, loop: AgentLoop, *,
              up_to: int | None = None) -> Replayed:
    """Step the loop through the record, at most ``up_to`` steps (module docstring)."""
    out = Replayed(state, [])
    end = recording.end
    n = 0
    while True:
        kind: StepKind = "tool" if pending_calls(state) else "model"
        n += 1
        before = len(state.messages)
        try:
            nxt = loop.step(state)
            while isinstance(nxt, AwaitApproval):
                mark = end.approvals.get(nxt.call.id) if end is not None else None
                if mark is None or mark == "pending":
                    raise Diverged(f"the call {nxt.call.name} waits for an approval the record "
                                   "has no answer to (the approval policy changed, or the "
                                   "turn never got one)")
                state.approvals[nxt.call.id] = mark
                nxt = loop.step(state)
            if isinstance(nxt, AwaitSubagents):
                found = recorded_result(recording, nxt.call.id)
                if found is None:
                    raise Diverged(f"the fan-out {nxt.call.name} ({nxt.call.id}) has no "
                                   "recorded result")
                answer_call(state, nxt.call.id, ToolResult(found.content, found.is_error))
                nxt = RunAgain()
        except Diverged as d:
            out.divergence = Divergence(n, kind, d.what, d.recorded, d.now)
            return out
        summary, calls = _summary(state, kind, before)
        out.steps.append(Step(n, kind, summary, calls))
        if isinstance(nxt, Final | Failed):
            out.outcome = nxt
            return out
        if up_to is not None and n >= up_to:
            out.stopped_after = n
            return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class ReplayReport:
    """What ``fermix replay`` prints and ``POST /v1/runs/{id}/replay`` returns."""

    run_id: str
    recorded_steps: int
    steps: list[Step]
    reproduced: bool
    divergence: Divergence | None
    reply: str | None
    recorded_reply: str | None
    stopped_after: int | None = None
    detail: dict[str, Any] | None = None
    cut: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id, "recordedSteps": self.recorded_steps,
            "steps": [s.as_json() for s in self.steps], "reproduced": self.reproduced,
            "divergence": self.divergence.as_json() if self.divergence else None,
            "reply": self.reply, "recordedReply": self.recorded_reply,
            "replySha256": digest(self.reply) if self.reply is not None else None,
            "stoppedAfter": self.stopped_after, "detail": self.detail, "cut": self.cut,
        }


def recorded_steps(recording: rec.Recording) -> int:
    """How many steps the record holds: its model calls and the tool calls they asked for."""
    calls = [c for c in recording.calls.values() if c.response is not None]
    return len(recording.calls) + sum(len(c.response.tool_calls) for c in calls
                                      if c.response is not None)


def replay(recording: rec.Recording, settings: Settings, tools: ToolRegistry, *,
           step: int | None = None, mask: Callable[[str], str] = lambda text: text
           ) -> ReplayReport:
    """Replay the recorded turn (module docstring); ``step``: stop after it, and show it."""
    start = recording.start
    if start is None:
        raise ValueError(f"run {recording.run_id}'s record has no start (it began before "
                         "the recorder was on, or its first entry expired)")
    state = first_state(start, settings)
    offered = turn_tools(tools, start, settings)
    done = run_steps(recording, state, replay_loop(recording, state, offered, settings,
                                                   mask=mask), up_to=step)
    divergence, reply = done.divergence, None
    end = recording.end
    if done.outcome is not None:
        reply = done.outcome.text if isinstance(done.outcome, Final) else done.outcome.message
        if end is None:
            divergence = Divergence(len(done.steps), "end", "the record has no end (the turn "
                                    "had not ended when it was read)")
        elif (end.outcome == "final") != isinstance(done.outcome, Final) or end.reply != reply:
            divergence = Divergence(len(done.steps), "end", "the reply differs",
                                    end.reply[:200], reply[:200])
        elif end.text != (text := turn_text(state, reply if end.outcome == "final" else "")):
            i, a, b = excerpt(end.text, text)
            divergence = Divergence(len(done.steps), "end",
                                    f"the turn's text differs at character {i + 1}", a, b)
    detail = None
    if step is not None and done.steps and done.steps[-1].n == step:
        detail = step_detail(recording, done.state, done.steps[-1])
    return ReplayReport(
        run_id=recording.run_id, recorded_steps=recorded_steps(recording), steps=done.steps,
        reproduced=divergence is None and (done.outcome is not None or step is not None),
        divergence=divergence, reply=reply, recorded_reply=end.reply if end else None,
        stopped_after=done.stopped_after, detail=detail, cut=recording.cut is not None)


def step_detail(recording: rec.Recording, state: LoopState, step: Step) -> dict[str, Any]:
    """The last replayed step as recorded: the model call's request and response, or the
    tool call's arguments and result."""
    if step.kind == "model":
        i = state.iteration - 1
        call = recording.calls.get(i)
        request = recording.requests().get(i)
        return {
            "kind": "model", "index": i,
            "request": recorded_json(request) if request else None,
            "response": call.response.model_dump() if call and call.response else None,
            "error": call.error.model_dump() if call and call.error else None,
        }
    answer = next((m for m in reversed(state.messages) if m.role == "tool"), None)
    found = recorded_result(recording, answer.tool_call_id or "") if answer else None
    return {"kind": "tool", "call": found.call.model_dump() if found else None,
            "content": found.content if found else None,
            "isError": found.is_error if found else None}
