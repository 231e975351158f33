"""The contract between a turn that fans out (the ``subagents`` tool) and the machinery that
runs the fan-out as a Celery chord and hands the merged result back.

The turn parks (checkpointed, its worker given back, the conversation still taken until the
fan-out's deadline) and :meth:`FanOut.launch` starts ``chord(group(subagents), resume)``. The
chord's callback calls :meth:`TurnRunner.resume_fanout` on whichever worker runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, PolicyClass, RunProfile, Trust
from fermix_worker.tools.context import AuditRecorder, TurnContext
from fermix_worker.tools.policy import ToolScope


@dataclass(frozen=True)
class FanOutRequest:
    """A fan-out to start for a parked turn."""

    run_id: str
    conv: str
    call: ToolCall
    trust: Trust
    profile: RunProfile
    model: str
    # The parked turn's tool scope (trust, its agent's tool list and policy classes): what
    # its subagents are bounded by (fermix_worker/subagents/registry.py).
    scope: ToolScope
    # The parked turn's agent (fermix_shared/agents/definitions.py): its delegates bound ``skill_run``.
    agent: str = "default"
    # The parked turn's user (fermix_shared/usage/scopes.py): with the agent and the
    # conversation, who the fan-out's model calls are charged to.
    user: str = ""
    # A scheduled run's delivery chat: where its subagents' approvals are asked, and (per
    # conversation) whose workspace folder they read.
    deliver_to: ConversationKey | None = None

    def parent_limits(self) -> tuple[list[str] | None, list[PolicyClass]]:
        """The parked turn's tool list (None: none) and effective policy classes, as a
        subagent job carries them."""
        tools = self.scope.allowed_tools
        return (None if tools is None else list(tools)), sorted(self.scope.effective_policies())

    def parent_turn(self) -> TurnContext:
        """The parked turn as its tools see it (its subagents read its workspace)."""
        return TurnContext(key=ConversationKey.parse(self.conv), sender_id="", trust=self.trust,
                           run_id=self.run_id, deliver_to=self.deliver_to, agent=self.agent)


class FanOut(Protocol):
    def deadline(self, call: ToolCall, profile: RunProfile) -> float:
        """Seconds the parked turn may wait before the reaper treats it as lost."""
        ...

    def launch(self, request: FanOutRequest, recorder: AuditRecorder) -> None:
        """Start the fan-out (its spawn audited through ``recorder``, the parked turn's); its
        callback must end in ``TurnRunner.resume_fanout``."""
        ...


class NoFanOut:
    """Used where fan-out is not available: nothing can park."""

    def deadline(self, call: ToolCall, profile: RunProfile) -> float:
        return 0.0

    def launch(self, request: FanOutRequest, recorder: AuditRecorder) -> None:
        raise RuntimeError("fan-out is not available in this process")
