"""What a turn's lease operations can answer, as types (the Lua scripts' result codes stop at
the store boundary: see :class:`LeaseCode`).

* ``finish`` (commit, deliver, release): :class:`Released` with the messages waiting behind the
  turn, :class:`Fenced` (another worker holds the conversation), or :class:`StopWon` (a /stop
  came first and ``deliver`` was asked); nothing is written in the last two cases;
* ``begin_delivery`` (check and mark before a platform send): :class:`Cleared`, :class:`Fenced`
  or :class:`StopWon`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class LeaseCode(IntEnum):
    """Negative result codes of finish.lua and begin_delivery.lua."""

    FENCED = -1
    STOP_WON = -2


@dataclass(frozen=True)
class Released:
    waiting: int


@dataclass(frozen=True)
class Cleared:
    pass


@dataclass(frozen=True)
class Fenced:
    pass


@dataclass(frozen=True)
class StopWon:
    pass


FinishResult = Released | Fenced | StopWon
DeliveryGate = Cleared | Fenced | StopWon


def finish_result(code: int) -> FinishResult:
    """finish.lua's answer: the inbox size (>= 0) or a :class:`LeaseCode`."""
    if code >= 0:
        return Released(code)
    return Fenced() if LeaseCode(code) is LeaseCode.FENCED else StopWon()


def delivery_gate(code: int) -> DeliveryGate:
    """begin_delivery.lua's answer: 1 to go ahead, or a :class:`LeaseCode`."""
    if code >= 0:
        return Cleared()
    return Fenced() if LeaseCode(code) is LeaseCode.FENCED else StopWon()
