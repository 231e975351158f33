"""TurnRunner: one claimed turn through prepare, AgentLoop, and close.

The runner owns the turn's side effects (history, run records, events); the loop owns none.
For the HTTP channel, delivery is the run record's ``reply``, written by the same atomic step
that commits history and releases the conversation, and only if the turn still holds the
conversation and was not cancelled (compare-and-deliver). Every turn ends in exactly one of:
delivered (``ok``/``error``), stopped (history gets the seed's marker), or fenced (nothing).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime

import redis

from fermix_shared import keys
from fermix_shared.errors import ConfigError, LeaseLost, TurnCancelled
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord, RunStatus, now
from fermix_shared.settings import Settings
from fermix_shared.stores import history, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.queue import TurnLease
from fermix_worker.lease import LeaseKeeper
from fermix_worker.loop import AgentLoop, Failed, Final, LoopState
from fermix_worker.providers import get_provider
from fermix_worker.tools.base import ToolRegistry, ToolResult
from fermix_worker.typing_indicator import TypingIndicator

log = logging.getLogger(__name__)

GENERIC_ERROR = "Sorry — something went wrong while handling that. Please try again."
EMPTY_COMPLETION = "I didn’t get a response — please try again."
STOPPED_MARKER = (
    "The previous request was stopped before I finished it. It is kept here for context only…"
)
_NO_REPLY = re.compile(r"\bNO_REPLY\b", re.IGNORECASE)

# Returns the channel's "typing…" sender for a conversation, or None (HTTP has none).
TypingFor = Callable[[ConversationKey], Callable[[], None] | None]


def shape_reply(text: str) -> str:
    """The text the user sees: the ``NO_REPLY`` silent token removed wherever it stands."""
    return _NO_REPLY.sub("", text).strip()


def merge_texts(messages: list[InboundMessage]) -> str:
    """Collect mode: pending messages become one turn, in arrival order."""
    if len(messages) == 1:
        return messages[0].text
    return "\n\n".join(m.text for m in messages)


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
    def __init__(
        self,
        r: redis.Redis,
        settings: Settings,
        tools: ToolRegistry,
        typing_for: TypingFor = lambda key: None,
    ):
        self._r = r
        self._settings = settings
        self._tools = tools
        self._typing_for = typing_for

    def _system_prompt(self) -> str:
        # The date is not part of the cached prompt base, so it never goes stale.
        today = datetime.now(UTC).strftime("%A %Y-%m-%d %H:%M UTC")
        return f"{self._settings.system_prompt}\n\nCurrent date: {today}."

    def run(self, messages: list[InboundMessage], lease: TurnLease) -> int:
        """Run the claimed turn (messages[0], plus any merged into it).

        Returns how many messages wait behind it, or -1 if the turn was fenced.
        """
        s = self._settings
        msg = messages[0]
        merged = [m.run_id for m in messages[1:]]
        conv = msg.key.as_str()
        events = RunEvents(self._r, msg.run_id)
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.started_at, record.worker = RunStatus.running, now(), lease.worker
        runs.put(self._r, record)
        events.emit("lifecycle", phase="start", startedAt=record.started_at)

        def steered() -> list[str]:
            taken = lease.take_steered()
            merged.extend(m.run_id for m in taken)
            return [m.text for m in taken]

        commit: list[ChatMessage] = []
        typing = self._typing_for(msg.key)
        try:
            with LeaseKeeper(lease, s.cancel_poll_seconds) as keeper, (
                TypingIndicator(typing) if typing else contextlib.nullcontext()
            ):
                past = history.load(self._r, conv, s.history_limit)
                user = ChatMessage(role="user", content=merge_texts(messages))
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
                    inject=steered,
                )
                outcome = loop.run(state, checkpoint=self._checkpoint)
                if isinstance(outcome, Final):
                    commit = self._final_history(state, shape_reply(outcome.text))
        except LeaseLost:
            log.warning("turn %s lost its lease; fenced, not delivering", msg.run_id)
            return -1
        except TurnCancelled:
            return self._close_stopped(msg, lease, merged)
        except ConfigError as e:
            outcome = Failed(f"Fermix is misconfigured: {e}", str(e))
        except Exception as e:
            log.exception("turn %s crashed", msg.run_id)
            outcome = Failed(GENERIC_ERROR, f"{type(e).__name__}: {e}")

        record.ended_at = now()
        if isinstance(outcome, Failed):
            record.status, record.error = RunStatus.error, outcome.message
        else:
            record.status = RunStatus.ok
            record.reply = self._reply_text(commit, state)
        history_json = [m.model_dump_json() for m in commit]
        remaining = lease.finish(record, history_json, s.history_limit, deliver=True)
        if remaining == -2:  # /stop won the race with our delivery
            return self._close_stopped(msg, lease, merged)
        if remaining >= 0:
            self._announce(record, merged)
        return remaining

    @staticmethod
    def _final_history(state: LoopState, reply: str) -> list[ChatMessage]:
        """What a finished turn commits after its user message; nothing for an empty reply,
        so it cannot poison later turns, unless a tool already replied (then a marker)."""
        turn = state.turn_messages()[1:]
        if reply:
            return [*turn[:-1], turn[-1].model_copy(update={"content": reply})]
        if state.side_effects:
            marker = f"[replied with {', '.join(sorted(set(state.side_effects)))}]"
            return [*turn[:-1], ChatMessage(role="assistant", content=marker)]
        return []

    @staticmethod
    def _reply_text(commit: list[ChatMessage], state: LoopState) -> str | None:
        if not commit:
            return EMPTY_COMPLETION
        if state.side_effects and commit[-1].content.startswith("[replied with"):
            return None  # the tool's reaction or attachment was the reply
        return commit[-1].content

    def _checkpoint(self, state: LoopState) -> None:
        self._r.set(keys.run_state(state.run_id), state.model_dump_json(), ex=keys.RUN_TTL_SECONDS)

    def _close_stopped(self, msg: InboundMessage, lease: TurnLease, merged: list[str]) -> int:
        """Close a cancelled turn: ``stopped``, nothing delivered, the marker in history."""
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.ended_at, record.reply = RunStatus.stopped, now(), None
        marker = ChatMessage(role="assistant", content=STOPPED_MARKER)
        remaining = lease.finish(
            record, [marker.model_dump_json()], self._settings.history_limit, deliver=False
        )
        if remaining >= 0:
            self._announce(record, merged)
        return remaining

    def close_orphan(self, msg: InboundMessage, lease: TurnLease, cancelled: str) -> int:
        """Close a turn whose worker died: stopped if it had been cancelled, else ``error``
        with the generic error (nothing was delivered: delivery and release are one step)."""
        if cancelled:
            return self._close_stopped(msg, lease, [])
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.ended_at, record.error = RunStatus.error, now(), GENERIC_ERROR
        remaining = lease.finish(record, [], self._settings.history_limit, deliver=True)
        if remaining >= 0:
            self._announce(record, [])
        return remaining

    def _announce(self, record: RunRecord, merged: list[str]) -> None:
        """Terminal lifecycle events for the run and for runs merged into it (collect/steer),
        which share its outcome."""
        for run_id in merged:
            copy = record.model_copy(update={"run_id": run_id, "merged_into": record.run_id})
            runs.put(self._r, copy)
            emit_end(RunEvents(self._r, run_id), copy)
        emit_end(RunEvents(self._r, record.run_id), record)


def emit_end(events: RunEvents, record: RunRecord) -> None:
    """The run's one terminal lifecycle event."""
    if record.status is RunStatus.error:
        events.emit("lifecycle", phase="error", endedAt=record.ended_at, error=record.error)
    else:
        events.emit("lifecycle", phase="end", endedAt=record.ended_at,
                    status=record.status.value, reply=record.reply)
