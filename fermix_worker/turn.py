"""TurnRunner: one user message through prepare, AgentLoop, deliver+commit.

The runner owns the turn's side effects (history, run record, events); the loop owns none.
Delivery for the HTTP channel is the run record's ``reply``, written by the same atomic step
that commits history and releases the conversation (compare-and-commit): a fenced turn can do
neither.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

import redis

from fermix_shared import keys
from fermix_shared.errors import ConfigError, ControlSignal
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.settings import Settings
from fermix_shared.stores import history, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.queue import TurnLease
from fermix_worker.lease import LeaseKeeper
from fermix_worker.loop import AgentLoop, Failed, Final, LoopState
from fermix_worker.providers import get_provider
from fermix_worker.tools.base import ToolRegistry, ToolResult

log = logging.getLogger(__name__)

GENERIC_ERROR = "Sorry — something went wrong while handling that. Please try again."
EMPTY_COMPLETION = "I didn’t get a response — please try again."
_NO_REPLY = re.compile(r"\bNO_REPLY\b", re.IGNORECASE)


def shape_reply(text: str) -> str:
    """The text the user sees: the ``NO_REPLY`` silent token removed wherever it stands."""
    return _NO_REPLY.sub("", text).strip()


class EventSink:
    """LoopEvents over the run's Redis stream."""

    def __init__(self, events: RunEvents):
        self._events = events

    def assistant_delta(self, text: str) -> None:
        self._events.emit("assistant", delta=text)

    def tool_start(self, call: ToolCall) -> None:
        self._events.emit("tool", phase="start", name=call.name, callId=call.id, args=call.arguments)

    def tool_result(self, call: ToolCall, result: ToolResult) -> None:
        self._events.emit(
            "tool", phase="result", name=call.name, callId=call.id,
            isError=result.is_error, result=result.content[:2000],
        )


class TurnRunner:
    def __init__(self, r: redis.Redis, settings: Settings, tools: ToolRegistry):
        self._r = r
        self._settings = settings
        self._tools = tools

    def _system_prompt(self) -> str:
        # The date is not part of the cached prompt base, so it never goes stale.
        today = datetime.now(UTC).strftime("%A %Y-%m-%d %H:%M UTC")
        return f"{self._settings.system_prompt}\n\nCurrent date: {today}."

    def run(self, msg: InboundMessage, lease: TurnLease) -> int:
        """Run the turn; returns how many messages wait behind it (-1 if it was fenced)."""
        s = self._settings
        conv = msg.key.as_str()
        events = RunEvents(self._r, msg.run_id)
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.started_at, record.worker = RunStatus.running, now(), lease.worker
        runs.put(self._r, record)
        events.emit("lifecycle", phase="start", startedAt=record.started_at)

        commit: list[ChatMessage] = []
        try:
            with LeaseKeeper(lease, s.lease_seconds / 3) as keeper:
                past = history.load(self._r, conv, s.history_limit)
                user = ChatMessage(role="user", content=msg.text)
                history.append(self._r, conv, [user])
                state = LoopState(
                    run_id=msg.run_id,
                    model=s.resolved_model(),
                    system=self._system_prompt(),
                    messages=[*past, user],
                    turn_start=len(past),
                )
                loop = AgentLoop(
                    get_provider(s.resolved_provider(), s),
                    self._tools,
                    EventSink(events),
                    max_tokens=s.max_tokens,
                    check=keeper.check,
                )
                outcome = loop.run(state, checkpoint=self._checkpoint)
                if isinstance(outcome, Final) and (reply := shape_reply(outcome.text)):
                    commit = state.turn_messages()[1:]
                    commit[-1] = commit[-1].model_copy(update={"content": reply})
        except ControlSignal:
            log.info("turn %s fenced; not delivering", msg.run_id)
            return -1
        except ConfigError as e:
            outcome = Failed(f"Fermix is misconfigured: {e}", str(e))
        except Exception as e:
            log.exception("turn %s crashed", msg.run_id)
            outcome = Failed(GENERIC_ERROR, f"{type(e).__name__}: {e}")

        record.ended_at = now()
        if isinstance(outcome, Failed):
            record.status, record.error = RunStatus.error, outcome.message
        else:
            # An empty completion is answered but never committed (it would poison history).
            record.status = RunStatus.ok
            record.reply = commit[-1].content if commit else EMPTY_COMPLETION
        remaining = lease.finish(record, [m.model_dump_json() for m in commit], s.history_limit)
        if remaining >= 0:
            self._emit_end(events, record)
        return remaining

    def _checkpoint(self, state: LoopState) -> None:
        self._r.set(keys.run_state(state.run_id), state.model_dump_json(), ex=keys.RUN_TTL_SECONDS)

    @staticmethod
    def _emit_end(events: RunEvents, record: RunRecord) -> None:
        if record.status is RunStatus.ok:
            events.emit("lifecycle", phase="end", endedAt=record.ended_at, reply=record.reply)
        else:
            events.emit("lifecycle", phase="error", endedAt=record.ended_at, error=record.error)

    def close_orphan(self, msg: InboundMessage, lease: TurnLease) -> int:
        """Close a turn whose worker died: ``error``, with the generic error, nothing committed."""
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.ended_at = RunStatus.error, now()
        record.error = GENERIC_ERROR
        remaining = lease.finish(record, [], self._settings.history_limit)
        if remaining >= 0:
            self._emit_end(RunEvents(self._r, msg.run_id), record)
        return remaining
