"""What happens when a turn ends: every way out of a turn, in one place.

* :meth:`TurnCloser.finish`: the loop gave a final answer or failed. The reply (or the error)
  is shaped, then delivered and committed with the conversation's release in one atomic step
  (compare-and-deliver) — unless /stop won the race (then as :meth:`stopped`) or the turn was
  fenced (nothing is written).
* :meth:`TurnCloser.stopped`: /stop. The run ends ``stopped``, nothing is delivered, history
  gets the seed's marker so the next turn keeps the user's message without answering it.
* :meth:`TurnCloser.orphan`: the worker died and the turn cannot be resumed (or was
  cancelled): the generic error (nothing was delivered: delivery and release are one step).

Every ended run then gets a metrics count, the post-turn listeners (memory review, compaction,
a job's record), and its terminal lifecycle event (and so do runs merged into it).
"""

from __future__ import annotations

import redis

from fermix_shared import metrics
from fermix_shared.messages import ChatMessage
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.settings import Settings
from fermix_shared.stores import history, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Fenced, Released, StopWon
from fermix_worker.loop import Failed, Final
from fermix_worker.loop_state import LoopState
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.delivery import Deliverer
from fermix_worker.turn.drive import GENERIC_ERROR
from fermix_worker.turn.events import emit_end
from fermix_worker.turn.listeners import TurnEnded, TurnListeners
from fermix_worker.turn.outcome import Delivered, Stopped, TurnOutcome
from fermix_worker.turn.reply import SILENT_HISTORY_MARKER, empty_turn_reply, is_silent, shape_reply

STOPPED_MARKER = (
    "The previous request was stopped before I finished it. It is kept here for context only…"
)


def final_history(state: LoopState, reply: str, *, silent: bool = False) -> list[ChatMessage]:
    """What a finished turn commits after its user message; nothing for an empty reply, so it
    cannot poison later turns, unless a tool already replied or the model chose silence (then
    a compact marker, never the silent token)."""
    turn = state.turn_messages()[1:]
    if silent:
        return [*turn[:-1], ChatMessage(role="assistant", content=SILENT_HISTORY_MARKER)]
    if reply:
        return [*turn[:-1], turn[-1].model_copy(update={"content": reply})]
    if state.side_effects:
        marker = f"[replied with {', '.join(sorted(set(state.side_effects)))}]"
        return [*turn[:-1], ChatMessage(role="assistant", content=marker)]
    return []


def error_history(message: str) -> ChatMessage:
    """What a failed turn commits after its user message: the error the user was told, so
    run and history agree and the next turn does not answer the message again. The turn's
    partial tool calls are not kept (a call without its result would break the next prompt)."""
    return ChatMessage(role="assistant", content=message)


def reply_text(commit: list[ChatMessage], state: LoopState) -> str | None:
    """The reply of a finished turn: its text, the seed's empty-completion (or failed-tool)
    reply when there is none, or None when a tool's reaction or attachment was the reply."""
    if not commit:
        return empty_turn_reply(state.tool_failures)
    if state.side_effects and commit[-1].content.startswith("[replied with"):
        return None
    return commit[-1].content


class TurnCloser:
    def __init__(self, r: redis.Redis, settings: Settings, deliverer: Deliverer,
                 listeners: TurnListeners, checkpoints: Checkpoints):
        self._r = r
        self._settings = settings
        self._deliverer = deliverer
        self._listeners = listeners
        self._checkpoints = checkpoints

    def finish(
        self, msg: InboundMessage, lease: TurnLease, state: LoopState, record: RunRecord,
        result: Final | Failed, *, resend: bool = True,
    ) -> TurnOutcome:
        """Deliver and commit the loop's answer or failure; ``resend`` False commits a reply
        an earlier holder of the turn began to send, without sending it again."""
        silent, commit = False, [error_history(result.message)] if isinstance(result, Failed) else []
        if isinstance(result, Final):
            silent = is_silent(result.text, scheduled=msg.context == "scheduled")
            commit = final_history(state, shape_reply(result.text), silent=silent)
        record.ended_at = now()
        if isinstance(result, Failed):
            record.status, record.error = RunStatus.error, result.message
        else:
            record.status = RunStatus.ok
            record.reply = "" if silent else reply_text(commit, state)
        if state.last_input_tokens and msg.context == "interactive":
            # Saved before release, so the next turn's preflight sees it; measured against
            # the model that answered.
            history.save_measurement(self._r, msg.key.as_str(), state.last_input_tokens,
                                     state.answered_model or state.model)
        match self._deliverer.deliver(msg, lease, record, commit, resend=resend):
            case StopWon():
                return self.stopped(msg, lease, state.merged_runs)
            case Fenced() as fenced:
                return fenced
            case Released(waiting=n):
                self._ended(TurnEnded(
                    msg, record, commit, state.merged_runs, silent,
                    (state.usage.input_tokens, state.usage.output_tokens),
                ))
                return Delivered(n)

    def stopped(self, msg: InboundMessage, lease: TurnLease, merged: list[str]) -> TurnOutcome:
        """``stopped``, nothing delivered, the marker in history."""
        record = self._record(msg)
        record.status, record.ended_at, record.reply = RunStatus.stopped, now(), None
        marker = ChatMessage(role="assistant", content=STOPPED_MARKER)
        match lease.finish(
            record, [marker.model_dump_json()], self._settings.history_limit, deliver=False
        ):
            case Released(waiting=n):
                self._deliverer.stopped(msg)
                self._ended(TurnEnded(msg, record, [], merged,
                                      usage=self._checkpoints.usage(msg.run_id)))
                return Stopped(n)
            case Fenced() as fenced:
                return fenced
            case StopWon():  # pragma: no cover - finish without delivery cannot lose to /stop
                raise AssertionError("finish(deliver=False) answered StopWon")

    def orphan(self, msg: InboundMessage, lease: TurnLease, cancelled: str) -> TurnOutcome:
        """A turn whose worker died: ``stopped`` if it had been cancelled, else the generic
        error."""
        if cancelled:
            return self.stopped(msg, lease, [])
        record = self._record(msg)
        record.status, record.ended_at, record.error = RunStatus.error, now(), GENERIC_ERROR
        match self._deliverer.deliver(msg, lease, record, [error_history(GENERIC_ERROR)]):
            case Released(waiting=n):
                self._ended(TurnEnded(msg, record, usage=self._checkpoints.usage(msg.run_id)))
                return Delivered(n)
            case StopWon():
                return self.stopped(msg, lease, [])
            case Fenced() as fenced:
                return fenced

    def _record(self, msg: InboundMessage) -> RunRecord:
        return runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)

    def _ended(self, ended: TurnEnded) -> None:
        """The post-turn listeners, then the terminal lifecycle events for the run and the runs
        merged into it (collect/steer), which share its outcome. Listeners go first so that
        what they record (a job's run history) is there when a waiter wakes up."""
        record = ended.record
        metrics.count_turn(record.status)
        self._listeners.turn_ended(ended)
        for run_id in ended.merged:
            copy = record.model_copy(update={"run_id": run_id, "merged_into": record.run_id})
            runs.put(self._r, copy)
            emit_end(RunEvents(self._r, run_id), copy)
        emit_end(RunEvents(self._r, record.run_id), record)
