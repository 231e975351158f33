"""What happens when a turn ends: every way out of a turn, in one place.

* :meth:`TurnCloser.finish`: the loop gave a final answer or failed. The reply (or the error)
  is shaped, then delivered and committed with the conversation's release in one atomic step
  (compare-and-deliver) — unless /stop won the race (then as :meth:`stopped`) or the turn was
  fenced (nothing is written). A failed turn is never committed (seed): the user gets the
  error, history gets :data:`FAILED_MARKER` after the user's message, never the error text.
  A final text that repeats what a ``send_message`` call already sent is not sent again.
* :meth:`TurnCloser.refused`: a killed agent's message. Its reply says so; nothing is
  committed.
* :meth:`TurnCloser.stopped`: /stop. The run ends ``stopped``, nothing is delivered, history
  gets the seed's marker so the next turn keeps the user's message without answering it (a
  kill's stop also tells the chat, once).
* :meth:`TurnCloser.orphan`: the worker died and the turn cannot be resumed (or was
  cancelled): the generic error (nothing was delivered: delivery and release are one step).

Every ended run then gets a metrics count, the post-turn listeners (memory review, compaction,
a job's record), and its terminal lifecycle event (and so do runs merged into it).
"""

from __future__ import annotations

import logging

import redis

from fermix_shared import keys, metrics, tracing
from fermix_shared.agents.lifecycle import KILL_REASON, KILLED_NOTICE
from fermix_shared.messages import ChatMessage
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.settings import Settings
from fermix_shared.stores import history, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.lease import TurnLease
from fermix_shared.stores.lease_results import Fenced, Released, StopWon
from fermix_worker.loop import Failed, Final, turn_text
from fermix_worker.loop_state import LoopState
from fermix_worker.recorder.recording import Recorder
from fermix_worker.tools.messaging import SEND_MESSAGE
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.delivery import Deliverer
from fermix_worker.turn.drive import GENERIC_ERROR
from fermix_worker.turn.events import emit_end
from fermix_worker.turn.listeners import TurnEnded, TurnListeners
from fermix_worker.turn.outcome import Delivered, Stopped, TurnOutcome
from fermix_worker.turn.reply import (
    SILENT_HISTORY_MARKER,
    empty_turn_reply,
    is_silent,
    repeats_a_sent_message,
    shape_reply,
)

log = logging.getLogger(__name__)

STOPPED_MARKER = (
    "The previous request was stopped before I finished it. It is kept here for context only…"
)
# What history keeps after the user's message of a turn that failed or crashed: like the stop
# marker, the next turn keeps the message without answering it again, and never sees the error.
FAILED_MARKER = (
    "The previous request failed before I finished it. It is kept here for context only…"
)


def final_history(state: LoopState, reply: str, *, silent: bool = False) -> list[ChatMessage]:
    """What a finished turn commits after its user message; nothing for an empty reply, so it
    cannot poison later turns, unless a tool already replied or the model chose silence (then
    a compact marker, never the silent token)."""
    turn = [m for m in state.turn_messages()[1:] if m.role != "system"]
    if silent:
        return [*turn[:-1], ChatMessage(role="assistant", content=SILENT_HISTORY_MARKER)]
    if reply:
        return [*turn[:-1], turn[-1].model_copy(update={"content": reply})]
    if state.side_effects:
        marker = f"[replied with {', '.join(sorted(set(state.side_effects)))}]"
        return [*turn[:-1], ChatMessage(role="assistant", content=marker)]
    return []


def failed_history() -> ChatMessage:
    """What a failed (or crashed) turn commits after its user message: the compact
    :data:`FAILED_MARKER`, not the error the user was told (the turn never delivered an answer,
    so it is not committed), so the next turn neither answers the message again nor learns the
    error. The turn's partial tool calls are not kept (a call without its result would break
    the next prompt)."""
    return ChatMessage(role="assistant", content=FAILED_MARKER)


def sent_messages(state: LoopState) -> list[str]:
    """The texts this turn's ``send_message`` calls sent into the chat (those that succeeded):
    a final text that repeats one of them is not sent again."""
    ok = {m.tool_call_id for m in state.turn_messages() if m.role == "tool" and not m.is_error}
    return [str(c.arguments.get("text") or "") for m in state.turn_messages()
            if m.role == "assistant" for c in m.tool_calls
            if c.name == SEND_MESSAGE and c.id in ok]


def reply_text(commit: list[ChatMessage], state: LoopState) -> str | None:
    """The reply of a finished turn: its text, the seed's empty-completion (or failed-tool)
    reply when there is none, or None when a tool's reaction or attachment was the reply."""
    if not commit:
        return empty_turn_reply(state.tool_failures)
    if state.side_effects and commit[-1].content.startswith("[replied with"):
        return None
    return commit[-1].content


def with_interim(state: LoopState, commit: list[ChatMessage], reply: str | None) -> str | None:
    """The reply as the user reads it: when the turn ends in text, the text the model wrote
    before its tool calls comes first (so the streamed deltas add up to the reply, Fased);
    history keeps each step's text in its own message. A reply that is a marker or the seed's
    empty-turn text stays as it is."""
    if not reply or not commit or commit[-1].content != reply:
        return reply
    return turn_text(state, reply)


class TurnCloser:
    def __init__(self, r: redis.Redis, settings: Settings, deliverer: Deliverer,
                 listeners: TurnListeners, checkpoints: Checkpoints,
                 recorder: Recorder | None = None):
        self._r = r
        self._recorder = recorder
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
        silent, commit = False, [failed_history()] if isinstance(result, Failed) else []
        if isinstance(result, Final):
            silent = is_silent(result.text, scheduled=msg.context == "scheduled")
            text = shape_reply(result.text)
            if repeats_a_sent_message(text, sent_messages(state)):
                text = ""  # already in the chat: the send was the reply (Fased's suppression)
            commit = final_history(state, text, silent=silent)
        record.ended_at = now()
        if isinstance(result, Failed):
            record.status, record.error = RunStatus.error, result.message
        else:
            record.status = RunStatus.ok
            record.reply = "" if silent else with_interim(state, commit, reply_text(commit, state))
        measured = self._last_writes(msg, state, result)
        match self._deliverer.deliver(msg, lease, record, commit, resend=resend):
            case StopWon():
                return self.stopped(msg, lease, state.merged_runs)
            case Fenced() as fenced:
                return fenced
            case Released(waiting=n):
                self._ended(TurnEnded(
                    msg, record, commit, state.merged_runs, silent,
                    (state.usage.input_tokens, state.usage.output_tokens), measured,
                ))
                return Delivered(n)

    def _last_writes(self, msg: InboundMessage, state: LoopState,
                     result: Final | Failed) -> tuple[int, str] | None:
        """Before the delivery, in one round trip: the record's end entry (a failure to write
        it is logged only) and the conversation's measurement (saved before release, so the
        next turn's preflight sees it; measured against the model that answered), which it
        returns (None when none was saved)."""
        measured = None
        with self._r.pipeline(transaction=False) as pipe:
            if self._recorder is not None:
                self._recorder.end(state, isinstance(result, Final),
                                   result.text if isinstance(result, Final) else result.message,
                                   via=pipe)
            recording = len(pipe)
            if state.last_input_tokens and msg.context == "interactive":
                measured = (state.last_input_tokens, state.answered_model or state.model)
                history.save_measurement(pipe, msg.key.as_str(), *measured)
            wrote = pipe.execute(raise_on_error=False)
        for i, result_ in enumerate(wrote):
            if not isinstance(result_, Exception):
                continue
            if i >= recording:
                raise result_
            log.warning("the recorder could not write run %s's end: %s", msg.run_id, result_)
        return measured

    def refused(self, msg: InboundMessage, lease: TurnLease, record: RunRecord, text: str,
                merged: list[str]) -> TurnOutcome:
        """A message its agent may not take (killed): the run ends ``error`` with ``text`` as
        its reply, delivered once; nothing enters history (the message was never taken in)."""
        record.status, record.error, record.ended_at = RunStatus.error, text, now()
        match self._deliverer.deliver(msg, lease, record, []):
            case Released(waiting=n):
                self._ended(TurnEnded(msg, record, [], merged))
                return Delivered(n)
            case StopWon():
                return self.stopped(msg, lease, merged)
            case Fenced() as fenced:
                return fenced

    def stopped(self, msg: InboundMessage, lease: TurnLease, merged: list[str]) -> TurnOutcome:
        """``stopped``, nothing delivered, the marker in history; a turn that a kill stopped
        tells its chat so (once), and its run's ``error`` says why."""
        record = self._record(msg)
        record.status, record.ended_at, record.reply = RunStatus.stopped, now(), None
        killed = self._r.hget(keys.active(msg.key.as_str()), "cancelled") in (
            KILL_REASON, KILL_REASON.encode())
        if killed:
            record.error = KILLED_NOTICE.format(agent=msg.agent)
        marker = ChatMessage(role="assistant", content=STOPPED_MARKER)
        match lease.finish(
            record, [marker.model_dump_json()], self._settings.history_limit, deliver=False
        ):
            case Released(waiting=n):
                self._deliverer.stopped(msg)
                if killed and record.error:
                    self._deliverer.notice(msg, record.error, f"{msg.run_id}:killed")
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
        match self._deliverer.deliver(msg, lease, record, [failed_history()]):
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
        with tracing.span("fermix.listeners"):
            self._listeners.turn_ended(ended)
        with tracing.span("fermix.end_event"):
            for run_id in ended.merged:
                copy = record.model_copy(update={"run_id": run_id, "merged_into": record.run_id})
                runs.put(self._r, copy)
                emit_end(RunEvents(self._r, run_id), copy)
            emit_end(RunEvents(self._r, record.run_id), record)
