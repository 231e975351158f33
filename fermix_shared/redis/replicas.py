"""How many replicas a durable write waits for: the ``FERMIX_REDIS_WAIT_REPLICAS`` rule.

Two writes wait (``WAIT n timeout`` on the connection that wrote, :mod:`fermix_shared.redis.sentinel`):
the gateway's accept of an inbound message, and a worker's mark that a reply is being
delivered, before the platform send (:mod:`fermix_worker.turn.delivery`).

* ``auto`` (the default with Sentinel): wait for one replica while the primary has one
  connected; while it has none (a failover promoted the only replica, or the replicas are
  down), write without waiting: the gateway accepts, the worker sends. Each such write is
  counted (``fermix_unreplicated_accepts_total``, ``fermix_unreplicated_deliveries_total``)
  and one WARNING per process is logged when it starts, one INFO when a replica is back. This
  is MySQL semi-sync's choice: fall back to asynchronous when no replica answers.
* ``N`` (strict): wait for ``N`` replicas, always; fewer acknowledging is a 503 at accept.
  Survives the loss of the primary only with ``N + 1`` replicas.
* ``0`` (the default without Sentinel): no WAIT, no extra round trip.

The primary's connected replicas are read with ``ROLE`` (one small reply, the replicas it
streams to), at most once a second per process, and again at once when a WAIT falls short. A
WAIT is never sent with a timeout while the count says there is no replica. A worker reads
``INFO replication`` in the same round trip (under ``N`` too): the primary's replication id,
which its delivery marks carry so that a recovered turn can tell a failover from a crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fermix_shared import metrics

if TYPE_CHECKING:
    from fermix_shared.settings import Settings

log = logging.getLogger(__name__)

# How long a process trusts the replica count it read (seconds).
COUNT_TTL_S = 1.0

Step = Literal["accept", "delivery"]


@dataclass(frozen=True)
class WaitRule:
    """``replicas`` to wait for (0: never); ``strict`` False is ``auto``."""

    replicas: int
    strict: bool

    @property
    def label(self) -> str:
        """The setting's value as written: ``auto``, ``0`` or ``N``."""
        return "auto" if not self.strict and self.replicas else str(self.replicas)


NO_WAIT = WaitRule(0, strict=True)
AUTO = WaitRule(1, strict=False)


def wait_rule(settings: Settings) -> WaitRule:
    """``FERMIX_REDIS_WAIT_REPLICAS`` as a rule: unset is ``auto`` with Sentinel, else 0."""
    n = settings.redis_wait_replicas
    if n is None:
        n = "auto" if settings.redis_sentinels else 0
    return AUTO if n == "auto" else WaitRule(n, strict=True)


def connected_replicas(role: Any) -> int:
    """The replicas a ``ROLE`` reply of a master lists (0 for a replica or a sentinel)."""
    if not isinstance(role, (list, tuple)) or not role:
        return 0
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    return len(role[2]) if kind == "master" and len(role) > 2 else 0


class ReplicaWatch:
    """One process's view of the primary's replicas and of writes made without one.

    IO-free: the async and sync users (:class:`fermix_shared.redis.durability.AcceptWait`,
    :class:`fermix_shared.redis.durability.DeliveryWait`) read ``ROLE`` and report here."""

    def __init__(self, rule: WaitRule, step: Step, clock: Callable[[], float] = time.monotonic):
        self.rule, self.step, self._clock = rule, step, clock
        self.connected: int | None = None  # last count read; None: never read
        self._read_at = float("-inf")
        self.alone = False  # writing without a replica since the last transition
        self.unreplicated = 0

    def stale(self) -> bool:
        """Whether the count is older than :data:`COUNT_TTL_S` (and so must be read)."""
        return self._clock() - self._read_at >= COUNT_TTL_S

    def reading(self) -> None:
        """A read starts: concurrent callers use the current count meanwhile."""
        self._read_at = self._clock()

    def unread(self) -> None:
        """The read failed: the next caller reads again."""
        self._read_at = float("-inf")

    def saw(self, connected: int) -> None:
        self.connected, self._read_at = connected, self._clock()

    def wanted(self) -> int:
        """Replicas the next write waits for under the rule and the last count."""
        if self.rule.strict or self.rule.replicas == 0:
            return self.rule.replicas
        return 0 if self.connected == 0 else self.rule.replicas

    def unreplicated_write(self, why: str = "has no connected replica") -> None:
        """A write went ahead without a replica's acknowledgement: counted; one WARNING until
        a write is acknowledged again (:meth:`replicated_write`), not one per write."""
        self.unreplicated += 1
        metrics.count_unreplicated(self.step)
        if not self.alone:
            self.alone = True
            log.warning("the Redis primary %s: %s writes go ahead unreplicated "
                        "(FERMIX_REDIS_WAIT_REPLICAS=%s) until one acknowledges again; a loss "
                        "of this primary now loses them", why, self.step, self.rule.label)

    def replicated_write(self) -> None:
        if self.alone:
            self.alone = False
            log.info("a Redis replica acknowledges %s writes again", self.step)

    def status(self) -> dict[str, Any]:
        """For ``/healthz``: the rule, the count, and the writes made without a replica."""
        level = "ok"
        if self.rule.replicas and self.connected is not None and self.connected < self.rule.replicas:
            level = "fail" if self.rule.strict else "warn"
        return {"level": level, "wait": self.rule.label, "connected": self.connected,
                "unreplicated": self.unreplicated}
