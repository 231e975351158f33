"""SubagentClaim: who runs one subagent, so that one whose worker died is re-run at once.

A header task (``fermix.subagents.run``, acknowledged late) on a worker that dies stays unacked
in the broker until its visibility timeout (an hour by default), and the parent would read
"interrupted" at its fan-out deadline. So each execution *claims* its subagent in Redis
(``subagent_start``): its worker process, a token for this execution, and what publishing the
task again takes (:class:`RerunMessage`: task id, group, index in the group, chord callback).
The reaper finds a claim whose worker stopped beating, takes it back (``subagent_requeue``) and
calls :func:`republish`, which sends the task again under the same task id, group and index:
Celery's Redis chord records a header result once per (task id, index), so the callback reads
the re-run's report as that subagent's.

Exactly one execution reports:

- a duplicate (the broker's redelivery, or the re-run of a worker that was only slow) finds the
  subagent ``busy`` while its worker beats and looks again later (:class:`Busy`); once the
  subagent is ``done`` it returns the stored report (the chord ignores a second copy);
- an execution that lost its claim (its worker was silent past the threshold and a re-run took
  over) notices within a cancel poll, records nothing (``subagent_finish`` refuses) and
  reports nothing (:class:`Superseded`).

The reaper watches a subagent until the chord has counted its report (:func:`counted`, once
the task's result is stored): a worker that dies between recording the report and returning
it gets the task re-published, and the re-run returns the stored report.

A subagent waiting for a person's approval is *parked* (:meth:`SubagentClaim.park`): its state
is kept in the claim and its header task retries itself with the park's token; that retry, and
only it, takes the subagent back (with its state: :attr:`SubagentClaim.parked`) while the
worker that parked it beats. When that worker dies the reaper re-runs it as a running one, and
the re-run takes the parked state (:mod:`~fermix_worker.subagents.park`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

import redis
from celery import Celery

from fermix_shared import keys, lua
from fermix_shared.records import VersionedRecord
from fermix_shared.task_names import SUBAGENT_RUN_TASK
from fermix_worker.subagents.results import SubagentReport

RERUN_SCHEMA_VERSION = 1


class RerunMessage(VersionedRecord):
    """What publishing a header task again takes: its job and the ids the chord counts by."""

    SCHEMA_VERSION = RERUN_SCHEMA_VERSION

    task_id: str
    group_id: str | None = None
    group_index: int | None = None
    # The chord callback's signature, as the task's request carries it.
    chord: dict[str, Any] | None = None
    root_id: str | None = None
    parent_id: str | None = None
    job: dict[str, Any]


@dataclass(frozen=True)
class Busy:
    """Another execution runs this subagent on a live worker: look again later."""


@dataclass(frozen=True)
class Superseded:
    """This execution lost its subagent to a re-run (its worker was taken for dead): it
    reports nothing."""


def member(fanout_id: str, index: int) -> str:
    """The subagent's name in ``keys.subagents_running()``."""
    return f"{fanout_id}:{index}"


class SubagentClaim:
    """One execution's hold on one subagent of a fan-out."""

    def __init__(self, r: redis.Redis, fanout_id: str, index: int, worker: str,
                 message: RerunMessage, *, dead_ms: int, ttl_s: float,
                 park_token: str | None = None):
        self._r = r
        self._key = keys.subagent_run(fanout_id, index)
        self._member = member(fanout_id, index)
        self.worker = worker
        self.token = uuid.uuid4().hex
        self._message = message
        self._dead_ms = dead_ms
        self._ttl_ms = max(1000, int(ttl_s * 1000))
        # This execution is the retry of that park (None: not a park's retry).
        self.park_token = park_token
        # Set by :meth:`start`: the state of the parked subagent it took (JSON), if any.
        self.parked: str | None = None

    def reported(self) -> SubagentReport | None:
        """The subagent's report, if an execution already finished it."""
        state, report = self._r.hmget(self._key, ["state", "report"])
        if state == "done" and report:
            return SubagentReport.model_validate_json(report)
        return None

    def start(self) -> Literal["run"] | Busy | SubagentReport:
        """Take the subagent: ``"run"``; :class:`Busy` (a live worker runs it); or the report
        of the execution that finished it."""
        res: Any = lua.SUBAGENT_START(
            self._r, run=self._key, running=keys.subagents_running(), beats=keys.worker_beats(),
            member=self._member, worker=self.worker, token=self.token,
            message=self._message.model_dump_json(), dead_ms=self._dead_ms, ttl_ms=self._ttl_ms,
            park_token=self.park_token or "")
        match res[0]:
            case "run":
                parked = res[1] if len(res) > 1 else ""
                self.parked = (parked.decode() if isinstance(parked, bytes) else parked) or None
                return "run"
            case "done":
                return SubagentReport.model_validate_json(res[1])
            case _:
                return Busy()

    def held(self) -> bool:
        """Whether this execution still holds the subagent (no re-run took it over)."""
        return bool(self._r.hget(self._key, "token") == self.token)

    def park(self, parked: str) -> str | None:
        """Park the subagent this execution holds with its state ``parked`` (JSON): the token
        its retry presents to take it back, or None when a re-run took it over."""
        token = uuid.uuid4().hex
        done = int(lua.SUBAGENT_PARK(self._r, run=self._key, token=self.token, park_token=token,
                                     parked=parked))
        return token if done == 1 else None

    def finish(self, report: SubagentReport) -> bool:
        """Record the report; False when a re-run took the subagent over (record nothing)."""
        return int(lua.SUBAGENT_FINISH(self._r, run=self._key, token=self.token,
                                       report=report.model_dump_json())) == 1


def counted(r: redis.Redis, fanout_id: str, index: int) -> None:
    """The chord has counted the subagent's report: the reaper stops watching it (until then,
    a worker that dies after :meth:`SubagentClaim.finish` gets the stored report re-sent)."""
    lua.SUBAGENT_COUNTED(r, run=keys.subagent_run(fanout_id, index),
                         running=keys.subagents_running(), member=member(fanout_id, index))


def republish(app: Celery, raw: str) -> None:
    """Send a header task again under its own task id, group and index (the reaper's call)."""
    msg = RerunMessage.model_validate_json(raw)
    app.send_task(SUBAGENT_RUN_TASK, args=[msg.job], task_id=msg.task_id,
                  group_id=msg.group_id, group_index=msg.group_index, chord=msg.chord,
                  root_id=msg.root_id, parent_id=msg.parent_id)
