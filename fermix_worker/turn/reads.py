"""A new turn's reads: everything the start needs from Redis, in one round trip.

Between the claim and the first writes, :class:`~fermix_worker.turn.start.TurnStarter` needs
the agent's kill, the budgets, the conversation's last measurement and compaction backoff, its
session (begun here when it has none), its history window, the active facts' ids, the
skills' version and the run's record. Each had its own round trip (nine in all, 0.15-0.4 ms each on the turn's
critical path); :func:`read` sends them as one pipeline, and each consumer reads its part
through its ``*_from`` / ``*_by`` form (``lifecycle.kill_from``, ``history.window``, ...).

Nothing here decides anything: the starter does, in the order it always did (a killed agent's
message is refused before the rest matters). The session's ``SET NX`` is the one write: a
message refused because its agent was killed gives the session back (:meth:`give_back`), so
the next message still begins it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from fermix_shared import keys
from fermix_shared.memory import MAX_ACTIVE_FACTS
from fermix_shared.messages import ChatMessage
from fermix_shared.models import InboundMessage, RunRecord
from fermix_shared.stores import history, sessions


@dataclass(frozen=True)
class TurnReads:
    """What one pipeline read for a new turn (module docstring). ``budgets`` is None when
    usage is off, ``active_facts`` when the message may not read memory, ``skills_version``
    when the worker has no skills: then they were not read."""

    conv: str
    kill: Any
    budgets: Any
    measurement: tuple[int, str] | None
    backing_off: bool
    session_id: str | None
    history: list[ChatMessage]
    active_facts: Any
    skills_version: Any
    record: RunRecord | None

    def give_back(self, r: redis.Redis) -> None:
        """Undo the session this turn began (a turn refused before it started)."""
        if self.session_id is not None:
            r.delete(keys.session(self.conv))


def read(r: redis.Redis, msg: InboundMessage, *, history_limit: int, budgets: bool,
         memory: bool, skills: bool) -> TurnReads:
    """Read a new turn's inputs for ``msg`` (as its agent runs it) in one round trip."""
    conv = msg.key.as_str()
    session_id = sessions.new_id()
    with r.pipeline(transaction=False) as pipe:
        pipe.hget(keys.agents_killed(), msg.agent)
        pipe.get(keys.conv_usage(conv))
        pipe.exists(keys.compact_backoff(conv))
        pipe.set(keys.session(conv), session_id, nx=True)
        pipe.lrange(keys.history(conv), -history_limit, -1)
        if budgets:
            pipe.hgetall(keys.budgets())
        if memory:
            pipe.zrevrange(keys.memory_active(), 0, MAX_ACTIVE_FACTS - 1)
        if skills:
            pipe.get(keys.skills_version())
        pipe.get(keys.run(msg.run_id))
        got = iter(pipe.execute())
    kill, measured, backoff, began, past = (next(got) for _ in range(5))
    declared = next(got) if budgets else None
    active = next(got) if memory else None
    version = next(got) if skills else None
    record = next(got)
    return TurnReads(
        conv=conv, kill=kill, budgets=declared, measurement=history.measurement_from(measured),
        backing_off=bool(backoff), session_id=session_id if began else None,
        history=history.window(past), active_facts=active,
        # An absent version reads as "0" (the registry's own default), not as "not read".
        skills_version=None if not skills else (version if version is not None else "0"),
        record=RunRecord.model_validate_json(record) if record else None)
