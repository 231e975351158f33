"""Recording entries: what every emit point calls.

:func:`record` (a synchronous client) and :func:`arecord` (the gateway's asyncio client) append
one entry. Inside a turn, :func:`bound` sets who is acting (the sender, the run, the
conversation, the agent) for the turn's code, and :func:`record_here` records under it: the
tool registry and the tools use it, without a client or the turn in hand (a ContextVar: per
greenlet, so concurrent turns never see each other's).

Auditing fails open: a failed append is logged (ERROR, logger ``fermix_shared.audit.emit``)
and counted (``fermix_audit_write_failures_total{kind}``), and the action goes ahead; the
recording functions never raise. Every audited action writes the same Redis the audit does,
so when Redis is down the action fails on its own; what is left is a bug in the audit path,
and that must never stop a turn, a ``/stop`` or a pause.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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
class _Scope:
    r: redis.Redis
    who: Who
    detail: dict[str, Scalar] = field(default_factory=dict)


_scope: ContextVar[_Scope | None] = ContextVar("fermix_audit_scope", default=None)


@contextmanager
def bound(r: redis.Redis, who: Who, **detail: Scalar) -> Iterator[None]:
    """While the block runs, :func:`record_here` records as ``who`` into ``r``, adding
    ``detail`` (the caller's trust, say) to every entry."""
    token = _scope.set(_Scope(r, who, dict(detail)))
    try:
        yield
    finally:
        _scope.reset(token)


def record_here(kind: Kind, action: str, outcome: Outcome, **detail: Scalar) -> Appended | None:
    """Record under the bound scope; nothing outside one (a loop run by a unit test)."""
    scope = _scope.get()
    if scope is None:
        return None
    return _append(scope.r, kind, action, outcome, scope.who, {**scope.detail, **detail})


def bound_who() -> Who | None:
    """The bound scope's attribution, if any."""
    scope = _scope.get()
    return None if scope is None else scope.who
