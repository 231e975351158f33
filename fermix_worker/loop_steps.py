"""The closed set of next steps :meth:`fermix_worker.loop.AgentLoop.step` returns.

:class:`RunAgain` (more work), :class:`Final` (an answer), :class:`Failed` (the user's error),
or a park: :class:`AwaitSubagents` (a fan-out) or :class:`AwaitApproval` (a person's answer).
Their callers match on them exhaustively (``assert_never``). Re-exported by
:mod:`fermix_worker.loop`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fermix_shared.messages import ToolCall


@dataclass(frozen=True)
class RunAgain:
    """More work: call the model, or run the next tool call."""


@dataclass(frozen=True)
class Final:
    """The model answered without asking for tools."""

    text: str


@dataclass(frozen=True)
class Failed:
    """The turn cannot finish; ``message`` is what the user is told."""

    message: str
    detail: str = ""
    # The prompt no longer fits the context window: the runner may compact and retry.
    overflow: bool = False


@dataclass(frozen=True)
class AwaitSubagents:
    """The model called a fan-out tool: the turn checkpoints and parks (its worker is given
    back) until the fan-out's results arrive as this call's tool result."""

    call: ToolCall


@dataclass(frozen=True)
class AwaitApproval:
    """The model called a tool that needs a person's approval: the turn checkpoints and parks
    (its worker is given back) until the answer comes, or the wait times out (denied).
    ``reason`` says why, when it is not the tool's own rule (the taint check)."""

    call: ToolCall
    reason: str = ""


NextStep = RunAgain | Final | Failed | AwaitSubagents | AwaitApproval
# What a run of the loop ends in: an answer, a failure, or a park (fan-out, approval).
LoopOutcome = Final | Failed | AwaitSubagents | AwaitApproval
