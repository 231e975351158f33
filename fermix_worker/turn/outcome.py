"""How a turn ended, as its worker sees it: a closed set, matched exhaustively by callers.

* :class:`Delivered`: the run ended ``ok`` or ``error`` and its reply (or error) reached the user
  and history, in the same atomic step that released the conversation;
* :class:`Stopped`: /stop won (before or during delivery); the run ended ``stopped``, history
  got the seed's marker, nothing was delivered;
* :class:`Fenced`: this worker no longer held the conversation (its lease lapsed and another
  worker took the turn over); nothing was written;
* :class:`Parked`: the turn waits for a fan-out; its worker is free and the conversation stays
  taken until the fan-out's callback resumes it.

``waiting`` is how many messages queue behind the released conversation (dispatch the next one
when it is above zero).
"""

from __future__ import annotations

from dataclasses import dataclass

from fermix_shared.stores.lease_results import Fenced

__all__ = ["Delivered", "Fenced", "Parked", "Stopped", "TurnOutcome", "waiting"]


@dataclass(frozen=True)
class Delivered:
    waiting: int


@dataclass(frozen=True)
class Stopped:
    waiting: int


@dataclass(frozen=True)
class Parked:
    pass


TurnOutcome = Delivered | Stopped | Fenced | Parked


def waiting(outcome: TurnOutcome) -> int:
    """Messages to dispatch after ``outcome``: only a released conversation has any."""
    match outcome:
        case Delivered(waiting=n) | Stopped(waiting=n):
            return n
        case Fenced() | Parked():
            return 0
    raise AssertionError(outcome)  # pragma: no cover - closed set
