"""Post-turn listener: every ended turn counted in its minute by outcome, fleet-wide, for
the console's Fleet view (turns and errors a minute; fermix_shared/stores/fleet.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from fermix_shared.stores import fleet

if TYPE_CHECKING:
    from fermix_worker.turn.listeners import TurnEnded

log = logging.getLogger(__name__)


class CountTurns:
    """Counts each ended turn (``ok``, ``error``, ``stopped``); a failure is logged only."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r

    def __call__(self, ended: TurnEnded) -> None:
        try:
            fleet.count_turn(self._r, ended.record.status)
        except Exception as e:  # counting is for the view: the turn has ended either way
            log.warning("could not count the ended turn %s: %s", ended.record.run_id, e)
