"""Beat's scheduler: RedBeat, riding out a Redis outage or failover instead of exiting.

RedBeat retries its own Redis commands through an outage (``retry_period`` in its options),
but not the extension of its lock, which goes through the plain client: the first tick that
cannot reach Redis (a restart, a Sentinel failover) raised out of ``tick`` and beat exited,
leaving the fleet without a beat until a supervisor restarted it (seen in
``tests/worker/test_failover_fleet.py``).

Here a tick that cannot reach Redis is logged and tried again a second later. The lock
(``redbeat_lock_timeout``, 10 s) outlasts a failover (~2 s), and the promoted replica holds
the same lock token, so this beat keeps it. An outage longer than the lock lets a standby beat
take over; when Redis is back this beat's extension then fails with ``LockNotOwnedError`` and
it exits as before (its supervisor restarts it, as a standby). Ticks are idempotent (each job
occurrence is de-duplicated), so a tick repeated after a partial one fires nothing twice.

Selected by ``fermix beat`` (``-S fermix_shared.scheduling.beat:Scheduler``).
"""

from __future__ import annotations

import logging
from typing import Any

from redbeat import RedBeatScheduler
from redis.exceptions import ConnectionError, TimeoutError

log = logging.getLogger(__name__)

# After a tick that could not reach Redis, the next try comes this much later (seconds).
OUTAGE_RETRY_S = 1.0


class Scheduler(RedBeatScheduler):  # type: ignore[misc]
    """RedBeat, whose ticks survive a Redis outage (module docstring)."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        try:
            return float(super().tick(*args, **kwargs))
        except (ConnectionError, TimeoutError) as e:
            log.warning("beat: Redis unreachable (%s); trying again in %.0f s", e, OUTAGE_RETRY_S)
            return OUTAGE_RETRY_S

