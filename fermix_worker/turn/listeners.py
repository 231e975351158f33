"""Post-turn effects as listeners: what happens after a turn ended, outside the turn.

The turn announces every ended run (delivered or stopped) once, after its terminal event; the
worker runtime registers what reacts (the memory review, post-turn compaction, a scheduled
job's run record), so the turn itself imports none of those features. A listener runs after
the conversation was released and must not raise (a failure is logged and the others run).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from fermix_shared.messages import ChatMessage
from fermix_shared.models import InboundMessage, RunRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnEnded:
    """One ended turn: its message, its final record, what it committed after the user's
    message (empty when nothing was), the runs merged into it, whether the model chose
    silence, the tokens the turn's calls used (input, output), and the conversation's
    measurement the turn saved (prompt tokens, model; None when it saved none)."""

    msg: InboundMessage
    record: RunRecord
    committed: list[ChatMessage] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    silent: bool = False
    usage: tuple[int, int] = (0, 0)
    measured: tuple[int, str] | None = None


class TurnListener(Protocol):
    def __call__(self, ended: TurnEnded) -> None: ...


class TurnListeners:
    """The registered listeners, called in registration order."""

    def __init__(self, listeners: Iterable[TurnListener] = ()):
        self._listeners = list(listeners)

    def add(self, listener: TurnListener) -> None:
        self._listeners.append(listener)

    def turn_ended(self, ended: TurnEnded) -> None:
        for listener in self._listeners:
            try:
                listener(ended)
            except Exception:  # the turn is done and delivered; its effects are best effort
                log.exception("post-turn listener %r failed for %s", listener, ended.record.run_id)
