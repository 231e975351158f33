"""The turn's span: one per way a worker comes to hold a turn (a new message, a resume).

Its parent is the context the inbox message carried from the gateway's accept
(``InboundMessage.trace``), so every segment of a turn (started, parked for a fan-out or an
approval, resumed on any worker) is a child of that one accept span, in that one trace. It
names the run, the conversation, the agent and the worker; how the segment ended is its
``fermix.turn.outcome`` (``Delivered``, ``Stopped``, ``Parked``, ``Fenced``). Off
(fermix_shared/tracing.py), it is the invalid span and costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from opentelemetry.trace import Span

from fermix_shared import tracing
from fermix_shared.models import InboundMessage
from fermix_worker.turn.outcome import TurnOutcome

# How this worker came to hold the turn.
TurnEntry = Literal["start", "compact", "after_crash", "after_fanout", "after_approval",
                    "close_orphan"]


@contextmanager
def turn_span(msg: InboundMessage, worker: str, entry: TurnEntry) -> Iterator[Span]:
    """The span of one segment of ``msg``'s turn on ``worker`` (module docstring)."""
    with tracing.span_from(msg.trace, "fermix.turn", {
        "fermix.run_id": msg.run_id,
        "fermix.conversation": msg.key.as_str(),
        "fermix.channel": msg.key.channel,
        "fermix.agent": msg.agent,
        "fermix.worker": worker,
        "fermix.turn.entry": entry,
        "fermix.profile": msg.profile,
        "gen_ai.agent.name": msg.agent,
        "gen_ai.conversation.id": msg.key.as_str(),
    }, kind=tracing.SpanKind.CONSUMER) as span:
        yield span


def ended(span: Span, outcome: TurnOutcome) -> TurnOutcome:
    """``outcome``, noted on the turn's span."""
    span.set_attribute("fermix.turn.outcome", type(outcome).__name__)
    return outcome
