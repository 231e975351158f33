"""LeaseKeeper: renews a turn's lease in the background and watches for cancellation.

Every ``interval`` it renews the lease (one Lua call that also reports a /stop). If the
conversation was taken by someone else (our lease lapsed and a recovery claimed it), the turn
is fenced: :meth:`check` raises :class:`LeaseLost`, and the commit would be refused anyway.
If the turn was cancelled, :meth:`check` raises :class:`TurnCancelled`. The loop calls
``check`` between steps and on every streamed delta.
"""

from __future__ import annotations

import logging
import threading

from fermix_shared.errors import LeaseLost, TurnCancelled
from fermix_shared.stores.queue import TurnLease

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, lease: TurnLease, interval_s: float):
        self._lease = lease
        self._interval = interval_s
        self._stop = threading.Event()
        self._lost = threading.Event()
        self.cancelled = ""
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
                held, cancelled = self._lease.renew()
            except Exception:  # Redis blip: try again next interval; the lease has slack
                log.warning("lease renewal for %s failed", self._lease.turn_id, exc_info=True)
                continue
            if not held:
                self._lost.set()
                return
            if cancelled:
                self.cancelled = cancelled

    def check(self) -> None:
        """Raise if the turn must stop: LeaseLost (fenced) or TurnCancelled (/stop)."""
        if self._lost.is_set():
            raise LeaseLost(self._lease.turn_id)
        if self.cancelled:
            raise TurnCancelled(self.cancelled)
