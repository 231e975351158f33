"""Recording entries: what every emit point calls.

:func:`record` (a synchronous client) and :func:`arecord` (the gateway's asyncio client) append
one entry. A turn (or a subagent) makes a :class:`Recorder` for who is acting (the sender,
the run, the conversation, the agent) and hands it to the code acting for it: the tool
registry and the tools get it in their run context
(:class:`fermix_worker.tools.context.RunContext`), never from ambient state.

Auditing fails open: a failed append is logged (ERROR, logger ``fermix_shared.audit.emit``)
and counted (``fermix_audit_write_failures_total{kind}``), and the action goes ahead; the
recording functions never raise. Every audited action writes the same Redis the audit does,
so when Redis is down the action fails on its own; what is left is a bug in the audit path,
and that must never stop a turn, a ``/stop`` or a pause.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, TypedDict

import redis
import redis.asyncio as aioredis

from fermix_shared import metrics
from fermix_shared.audit import store
from fermix_shared.audit.chain import sha256_hex
from fermix_shared.audit.model import (
    KINDS,
    MAX_ACTION_CHARS,
    MAX_DETAIL_CHARS,
    OUTCOMES,
    Kind,
    Outcome,
    Scalar,
)
from fermix_shared.audit.store import Appended
from fermix_shared.models import InboundMessage

log = logging.getLogger(__name__)


class Who(TypedDict):
    """Who acts, and for which run, conversation and agent (``""`` when none)."""

    actor: str
    run_id: str
    conv: str
    agent: str


def who(msg: InboundMessage) -> Who:
    """A turn's attribution: its sender (``telegram:123``, ``http:api``), run, conversation and
    agent."""
    return Who(actor=f"{msg.key.channel}:{msg.sender_id}", run_id=msg.run_id,
               conv=msg.key.as_str(), agent=msg.agent)


def _scalar(name: str, value: Any) -> Scalar:
    if isinstance(value, str):
        return value if len(value) <= MAX_DETAIL_CHARS else "sha256:" + sha256_hex(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    raise TypeError(f"audit detail {name!r} must be a scalar, not {type(value).__name__}")


def make_body(kind: Kind, action: str, outcome: Outcome, who: Who,
              detail: dict[str, Any]) -> dict[str, Any]:
    """An entry's body (everything but the chain's header). ValueError / TypeError on a kind,
    outcome or detail value outside the model."""
    if kind not in KINDS or outcome not in OUTCOMES:
        raise ValueError(f"audit entry kind {kind!r} / outcome {outcome!r} is not in the model")
    return {
        "schema_version": 1, "kind": kind, "action": action[:MAX_ACTION_CHARS],
        "outcome": outcome, "actor": who["actor"], "run": who["run_id"], "conv": who["conv"],
        "agent": who["agent"], "detail": {k: _scalar(k, v) for k, v in detail.items()},
    }


def _failed(kind: str, error: Exception) -> None:
    # An unreachable Redis is one line (every action fails alike then); anything else is a
    # bug in the audit path, with its traceback.
    log.error("audit: could not record a %s entry; the action went ahead: %s", kind, error,
              exc_info=not isinstance(error, redis.ConnectionError | redis.TimeoutError))
    metrics.count_audit_failure(kind)


def _append(r: redis.Redis, kind: Kind, action: str, outcome: Outcome, who: Who,
            detail: dict[str, Any]) -> Appended | None:
    try:
        return store.append(r, make_body(kind, action, outcome, who, detail))
    except Exception as e:
        _failed(kind, e)
        return None


def record(r: redis.Redis, kind: Kind, action: str, outcome: Outcome, *, actor: str,
           run_id: str = "", conv: str = "", agent: str = "", **detail: Scalar
           ) -> Appended | None:
    """Append one entry; never raises (None when it could not be written)."""
    return _append(r, kind, action, outcome,
                   Who(actor=actor, run_id=run_id, conv=conv, agent=agent), detail)


async def arecord(r: aioredis.Redis, kind: Kind, action: str, outcome: Outcome, *, actor: str,
                  run_id: str = "", conv: str = "", agent: str = "", **detail: Scalar
                  ) -> Appended | None:
    """:func:`record` for an asyncio client (the gateway); never raises."""
    return await aappend(r, kind, action, outcome,
                         Who(actor=actor, run_id=run_id, conv=conv, agent=agent), detail)


async def aappend(r: aioredis.Redis, kind: Kind, action: str, outcome: Outcome, who: Who,
                  detail: dict[str, Any]) -> Appended | None:
    """:func:`arecord` with ``who`` and ``detail`` given whole; never raises."""
    try:
        return await store.append_async(r, make_body(kind, action, outcome, who, detail))
    except Exception as e:
        _failed(kind, e)
        return None


@dataclass(frozen=True)
class Recorder:
    """Records as ``who`` into ``r``, adding ``detail`` (the caller's trust, say) to every
    entry: what a turn or a subagent hands its tools and its own emit points (the tool
    registry's calls and refusals, a fan-out's spawn, an approval asked), so they record
    without a client or the turn in hand."""

    r: redis.Redis
    who: Who
    detail: dict[str, Scalar] = field(default_factory=dict)

    def record(self, kind: Kind, action: str, outcome: Outcome, **detail: Scalar
               ) -> Appended | None:
        """Append one entry under this recorder's attribution; never raises."""
        return _append(self.r, kind, action, outcome, self.who, {**self.detail, **detail})


def recorder(r: redis.Redis, who: Who, **detail: Scalar) -> Recorder:
    """A :class:`Recorder` for ``who`` into ``r``, adding ``detail`` to every entry."""
    return Recorder(r, who, dict(detail))
