"""The calling turn, for tools that act on its behalf (scheduling a job from a chat).

TurnRunner binds it around the loop; a tool reads :data:`current_turn`. A ContextVar is per
thread and per greenlet, so hundreds of concurrent turns in one gevent worker never see each
other's context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from fermix_shared.models import ConversationKey, InboundMessage, Trust


@dataclass(frozen=True)
class TurnContext:
    """Who is calling: the conversation, the sender, their trust, and (scheduled runs) where
    the run delivers."""

    key: ConversationKey
    sender_id: str
    trust: Trust
    run_id: str
    deliver_to: ConversationKey | None = None
    # The agent that runs the turn (fermix_shared/agents/definitions.py): its workspace, for one.
    agent: str = "default"
    # The turn's own tool subset (a scheduled run's, narrowed by its agent's list; None: none)
    # and whether the turn is offered a tool (None: not known here, so nothing is assumed):
    # a job the turn schedules may use no more than the turn.
    allowed_tools: tuple[str, ...] | None = None
    offers: Callable[[str], bool] | None = None

    @property
    def origin(self) -> ConversationKey | None:
        """Where "reply here" goes: the chat itself, or a scheduled run's own delivery."""
        return self.deliver_to if self.key.channel == "schedule" else self.key


current_turn: ContextVar[TurnContext | None] = ContextVar("fermix_current_turn", default=None)


@contextmanager
def bind_turn(msg: InboundMessage,
              offers: Callable[[str], bool] | None = None) -> Iterator[TurnContext]:
    """Make ``msg``'s turn (offered the tools ``offers`` says) the current one while the
    block runs."""
    ctx = TurnContext(key=msg.key, sender_id=msg.sender_id, trust=msg.trust, run_id=msg.run_id,
                      deliver_to=msg.deliver_to, agent=msg.agent,
                      allowed_tools=None if msg.allowed_tools is None else tuple(msg.allowed_tools),
                      offers=offers)
    token = current_turn.set(ctx)
    try:
        yield ctx
    finally:
        current_turn.reset(token)
