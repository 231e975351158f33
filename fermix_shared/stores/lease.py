"""TurnLease: one worker's hold on one conversation's active turn, and renewing many at once.

:func:`~fermix_shared.stores.queue.claim` (or ``unpark``) hands a worker a lease; with it the
worker renews its hold (``renew``, which also reports a cancellation), takes steered messages,
parks the turn on a fan-out, and gates and commits delivery (``begin_delivery``, ``finish``,
whose answers are :mod:`fermix_shared.stores.lease_results`): Lua scripts that act only while
this turn still holds the conversation. :func:`renew_leases` renews every turn of a process in
one round trip per Redis client (the worker's renewer).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from typing import Any, TypeAlias

import redis
from redis.exceptions import NoScriptError

from fermix_shared import keys, lua
from fermix_shared.models import InboundMessage, RunRecord
from fermix_shared.stores.lease_results import (
    DeliveryGate,
    FinishResult,
    delivery_gate,
    finish_result,
)


def now_ms() -> int:
    """The clock of the queue's scores and lease expiries: wall-clock milliseconds."""
    return int(time.time() * 1000)


class TurnLease:
    """One worker's hold on one conversation's active turn."""

    def __init__(self, r: redis.Redis, conv: str, turn_id: str, worker: str, lease_s: float):
        self._r = r
        self.conv = conv
        self.turn_id = turn_id
        self.worker = worker
        self.lease_ms = int(lease_s * 1000)

    def renew(self) -> Renewal:
        """Extend the lease. Returns (still held, cancellation reason or ""). Many leases at
        once: :func:`renew_leases`."""
        (answer,) = _renew_pipelined(self._r, [self])
        if isinstance(answer, Exception):
            raise answer
        return answer

    @functools.cached_property
    def _renew_command(self) -> list[Any]:
        """EVALSHA's arguments after the hash, ``now_ms`` left at 0 (bound once: a renewer
        sends them every interval)."""
        names, args = lua.RENEW.bind({
            "active": keys.active(self.conv), "active_index": keys.active_index(),
            "turn_id": self.turn_id, "worker": self.worker, "lease_ms": self.lease_ms,
            "now_ms": 0, "conv": self.conv})
        return [len(names), *names, *args]

    def take_steered(self) -> list[InboundMessage]:
        """Messages steered into this turn since the last call (steer mode)."""
        res: Any = lua.TAKE_STEER(
            self._r, active=keys.active(self.conv), steer=keys.steer(self.conv),
            turn_id=self.turn_id, worker=self.worker,
        )
        return [InboundMessage.model_validate_json(m) for m in res]

    def park(self, until_s: float) -> bool:
        """Give the worker back while the turn waits on a fan-out; the conversation stays
        taken until ``until_s`` seconds from now (then the reaper recovers it)."""
        until = now_ms() + int(until_s * 1000)
        res = lua.PARK(self._r, active=keys.active(self.conv), active_index=keys.active_index(),
                       turn_id=self.turn_id, worker=self.worker, lease_until_ms=until,
                       conv=self.conv)
        return int(res) == 1

    def begin_delivery(self, via: redis.Redis | None = None, mark: str = "1") -> DeliveryGate:
        """Before sending to a platform: :class:`Cleared` to go ahead, :class:`Fenced`, or
        :class:`StopWon` (/stop came first). ``via``: a client of the same pool pinned to one
        connection, for a WAIT on the mark; ``mark``: the mark's value, under a durability
        wait the primary's replication id (fermix_shared/redis/durability.py DeliveryWait)."""
        return delivery_gate(int(lua.BEGIN_DELIVERY(
            via or self._r, active=keys.active(self.conv), turn_id=self.turn_id,
            worker=self.worker, mark=mark,
        )))

    def delivery_mark(self, delivery_id: str) -> str | None:
        """The mark an earlier holder of this turn left when it began delivering its reply
        (its value, :meth:`begin_delivery`), if no chunk of the reply is marked sent; else
        None. The send may have happened or not: only a failover since the mark can have lost
        chunk marks written after a send (fermix_shared/redis/durability.py DeliveryWait)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.hget(keys.active(self.conv), "delivering")
        pipe.exists(keys.delivered(delivery_id))
        marked, sent = pipe.execute()
        if marked is None or sent:
            return None
        return marked.decode() if isinstance(marked, bytes) else str(marked)

    def finish(
        self, record: RunRecord, history: list[str], history_cap: int, *, deliver: bool
    ) -> FinishResult:
        """Write ``record`` and ``history`` and release the conversation, atomically.

        :class:`Released` with the messages waiting; :class:`Fenced` (this turn no longer
        holds the conversation) or :class:`StopWon` (``deliver`` lost the race with a /stop):
        nothing written in those two cases.
        """
        conv = self.conv
        return finish_result(int(
            lua.FINISH(
                self._r,
                active=keys.active(conv), inbox=keys.inbox(conv), run=keys.run(record.run_id),
                history=keys.history(conv), active_index=keys.active_index(),
                queued_index=keys.queued_index(), steer=keys.steer(conv),
                last_active=keys.agents_last_active(), turn_id=self.turn_id,
                worker=self.worker, record=record.model_dump_json(),
                run_ttl_s=keys.RUN_TTL_SECONDS, history_cap=history_cap, conv=conv,
                now_ms=now_ms(), mode="deliver" if deliver else "close", entries=history,
            )
        ))


Renewal: TypeAlias = tuple[bool, str]
"""A renewal's answer: (the turn still holds its conversation, cancellation reason or "")."""

# The name EVALSHA knows renew.lua by (Redis hashes the same bytes).
_RENEW_SHA = hashlib.sha1(lua.RENEW.source.encode()).hexdigest()
# Where now_ms sits in a lease's _renew_command (after the key count, the keys, the args).
_NOW_AT = 1 + len(lua.RENEW.keys) + lua.RENEW.args.index("now_ms")


def renew_leases(leases: Sequence[TurnLease]) -> list[Renewal | Exception]:
    """Renew many leases, one round trip per Redis client: a pipeline (no transaction) of
    plain EVALSHA (a registered script's pipeline would ask SCRIPT EXISTS first, a second
    round trip); calls refused with NOSCRIPT (restart, failover, ``SCRIPT FLUSH``) go again
    once the script is loaded. In order, each lease's :data:`Renewal` or the error it met:
    its pipeline's (Redis unreachable after the client's retries) or its own call's."""
    by_client: dict[int, list[int]] = {}
    for i, lease in enumerate(leases):
        by_client.setdefault(id(lease._r), []).append(i)
    answers: dict[int, Renewal | Exception] = {}
    for positions in by_client.values():
        batch = [leases[i] for i in positions]
        try:
            got = _renew_pipelined(batch[0]._r, batch)
        except Exception as e:  # the caller decides: a blip is retried next interval
            got = [e] * len(batch)
        answers.update(zip(positions, got, strict=True))
    return [answers[i] for i in range(len(leases))]


def _renew_pipelined(r: redis.Redis, leases: Sequence[TurnLease]) -> list[Renewal | Exception]:
    def send(batch: Sequence[TurnLease], sha: str) -> list[Any]:
        pipe = r.pipeline(transaction=False)
        now = now_ms()
        for lease in batch:
            command = lease._renew_command.copy()
            command[_NOW_AT] = now
            pipe.evalsha(sha, *command)
        return pipe.execute(raise_on_error=False)

    answers = send(leases, _RENEW_SHA)
    unknown = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
    if unknown:
        sha = str(r.script_load(lua.RENEW.source))
        for i, answer in zip(unknown, send([leases[i] for i in unknown], sha), strict=True):
            answers[i] = answer
    return [a if isinstance(a, Exception) else (int(a[0]) > 0, str(a[1]) if int(a[0]) == 2 else "")
            for a in answers]
