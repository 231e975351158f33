"""LeaseKeeper: renews a turn's lease in the background while the turn works.

If a renewal finds the conversation taken by someone else (our lease lapsed and a recovery
claimed it), the turn is fenced: :meth:`check` raises :class:`LeaseLost` at its next step and
:meth:`TurnLease.finish` refuses to commit.
"""

from __future__ import annotations

import logging
import threading

from fermix_shared.errors import LeaseLost
from fermix_shared.stores.queue import TurnLease

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, lease: TurnLease, interval_s: float):
        self._lease = lease
        self._interval = interval_s
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._lease.renew():
                    self._lost.set()
                    return
            except Exception:  # Redis blip: try again next interval; the lease has slack
                log.warning("lease renewal for %s failed", self._lease.turn_id, exc_info=True)

    def check(self) -> None:
        """Raise LeaseLost if this turn no longer holds its conversation."""
        if self._lost.is_set():
            raise LeaseLost(self._lease.turn_id)
