"""The conversation queue in Redis: a durable inbox per key and one active turn per key.

Every multi-key change is one Lua script (``accept``, ``claim``, ``renew``, ``finish``), so the
rules hold across any number of gateway and worker processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import redis
import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.models import InboundMessage, RunRecord
from fermix_shared.stores._lua import lua


@dataclass(frozen=True)
class Accepted:
    """Result of accepting a message: its run id, and whether it is new or a duplicate."""

    run_id: str
    new: bool


@dataclass(frozen=True)
class Claim:
    """Outcome of trying to take a conversation."""

    kind: Literal["busy", "empty", "claimed", "orphan"]
    message: InboundMessage | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _accept_args(
    msg: InboundMessage, dedupe_scope: str | None, message_id: str | None
) -> tuple[list[str], list[str | int]]:
    conv = msg.key.as_str()
    run_key = keys.run(msg.run_id)
    has_mark = bool(dedupe_scope and message_id)
    mark = keys.dedupe(dedupe_scope, message_id) if dedupe_scope and message_id else run_key
    record = RunRecord(run_id=msg.run_id, conversation=msg.key, accepted_at=msg.accepted_at)
    return (
        [mark, keys.inbox(conv), run_key],
        [
            msg.run_id,
            msg.model_dump_json(),
            record.model_dump_json(),
            keys.DEDUPE_TTL_SECONDS,
            keys.RUN_TTL_SECONDS,
            "1" if has_mark else "0",
        ],
    )


async def accept_async(
    r: aioredis.Redis,
    msg: InboundMessage,
    *,
    dedupe_scope: str | None = None,
    message_id: str | None = None,
) -> Accepted:
    """Gateway side of :func:`accept`."""
    k, a = _accept_args(msg, dedupe_scope, message_id)
    run_id, new = await r.eval(lua("accept"), len(k), *k, *a)
    return Accepted(run_id=run_id, new=bool(new))


def accept(
    r: redis.Redis,
    msg: InboundMessage,
    *,
    dedupe_scope: str | None = None,
    message_id: str | None = None,
) -> Accepted:
    """Durably append ``msg`` to its conversation's inbox and create its run record.

    With ``message_id``, a message already accepted under the same id in ``dedupe_scope`` is not
    appended again; the first run's id comes back with ``new=False``.
    """
    k, a = _accept_args(msg, dedupe_scope, message_id)
    run_id, new = r.eval(lua("accept"), len(k), *k, *a)
    return Accepted(run_id=run_id, new=bool(new))


class TurnLease:
    """One worker's hold on one conversation's active turn."""

    def __init__(self, r: redis.Redis, conv: str, turn_id: str, worker: str, lease_s: float):
        self._r = r
        self.conv = conv
        self.turn_id = turn_id
        self.worker = worker
        self.lease_ms = int(lease_s * 1000)

    def renew(self) -> bool:
        """Extend the lease; False means the turn lost the conversation and is fenced."""
        ok = self._r.eval(
            lua("renew"), 1, keys.active(self.conv),
            self.turn_id, self.worker, self.lease_ms, _now_ms(),
        )
        return bool(ok)

    def finish(self, record: RunRecord, history: list[str], history_cap: int) -> int:
        """Compare-and-commit ``record`` and ``history``, release the key.

        Returns the number of messages still waiting, or -1 if this turn was fenced.
        """
        return int(
            self._r.eval(
                lua("finish"),
                4,
                keys.active(self.conv),
                keys.inbox(self.conv),
                keys.run(record.run_id),
                keys.history(self.conv),
                self.turn_id,
                self.worker,
                record.model_dump_json(),
                keys.RUN_TTL_SECONDS,
                history_cap,
                *history,
            )
        )


def claim(r: redis.Redis, conv: str, worker: str, lease_s: float) -> tuple[Claim, TurnLease | None]:
    """Try to become the conversation's active turn (popping the inbox head)."""
    res = r.eval(lua("claim"), 2, keys.active(conv), keys.inbox(conv), worker, int(lease_s * 1000), _now_ms())
    kind = res[0]
    if kind in ("busy", "empty"):
        return Claim(kind), None
    msg = InboundMessage.model_validate_json(res[1])
    return Claim(kind, msg), TurnLease(r, conv, msg.run_id, worker, lease_s)
