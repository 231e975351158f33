"""A turn: one claimed message through prepare, run, deliver and commit.

Start at :mod:`~fermix_worker.turn.runner` (the entry points): a new message is started in
:mod:`~fermix_worker.turn.start`, a turn taken back (after a crash, a fan-out, an approval) is
resumed in :mod:`~fermix_worker.turn.resume`, and both run on in
:mod:`~fermix_worker.turn.proceed`, over what :mod:`~fermix_worker.turn.wiring` passes in.
:mod:`~fermix_worker.turn.close` is what happens when a turn ends;
:mod:`~fermix_worker.turn.outcome` is how it ended.
"""

from fermix_worker.turn.close import STOPPED_MARKER
from fermix_worker.turn.drive import GENERIC_ERROR
from fermix_worker.turn.outcome import Delivered, Fenced, Parked, Stopped, TurnOutcome
from fermix_worker.turn.runner import TurnRunner

__all__ = [
    "GENERIC_ERROR",
    "STOPPED_MARKER",
    "Delivered",
    "Fenced",
    "Parked",
    "Stopped",
    "TurnOutcome",
    "TurnRunner",
]
