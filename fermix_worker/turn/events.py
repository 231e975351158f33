"""A turn's run events: the loop's progress on the run's Redis stream, and the terminal one.

Streamed text passes the silent-token filter, so the deltas add up to the final reply. A
:class:`StreamListener` (the chat reply written live, :mod:`~fermix_worker.turn.live_reply`)
gets the same coalesced text as the stream, and a boundary where a tool call starts.

What reaches the stream is gated here, not in the loop: tool details (arguments, progress
text, results) only for a verbose run (:mod:`fermix_shared.run_config`), reasoning (the
``thinking`` stream) only for an agent with ``stream_thinking``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from fermix_shared import metrics
from fermix_shared.messages import ToolCall
from fermix_shared.models import RunRecord, RunStatus
from fermix_shared.run_events import (
    AssistantDelta,
    Diagnostic,
    RoutingFailover,
    RoutingRetry,
    RunEnded,
    RunEventRecord,
    RunFailed,
    Thinking,
    ToolFinished,
    ToolStarted,
    ToolUpdated,
)
from fermix_shared.stores.events import RunEvents
from fermix_worker.providers.routing import RoutingEventKind
from fermix_worker.tools.base import ToolResult
from fermix_worker.turn.reply import SilentTokenFilter


def _provider_of(route: object) -> str:
    """``openai/gpt-4.1-mini`` -> ``openai`` (metrics label)."""
    return str(route).split("/", 1)[0]


# Streamed text arriving within this long of the last ``assistant`` event is merged into the
# next one: a fast model's dozens of tiny deltas become a few events (each is a Redis XADD),
# while a reader still sees text at least every DELTA_INTERVAL_S while it flows.
DELTA_INTERVAL_S = 0.05


class StreamListener(Protocol):
    """Hears the turn's streamed text as the run's stream gets it. Must not block."""

    def text(self, piece: str) -> None:
        """More of the assistant message being written (what an ``assistant`` event holds)."""
        ...

    def boundary(self) -> None:
        """A tool call starts: text after it belongs to the next assistant message."""
        ...


class EventSink:
    """LoopEvents over the run's Redis stream. Streamed text is coalesced (see
    :data:`DELTA_INTERVAL_S`); any other event, and :meth:`flush`, first writes what is held,
    so the stream's order is the loop's. ``listener`` hears the text and tool boundaries.
    ``verbose``: tool events carry their details; ``thinking``: reasoning is streamed."""

    def __init__(self, events: RunEvents, clock: Callable[[], float] = time.monotonic,
                 listener: StreamListener | None = None, *, verbose: bool = False,
                 thinking: bool = False):
        self._events = events
        self._verbose, self._thinking = verbose, thinking
        self._silent = SilentTokenFilter()
        self._clock = clock
        self._held = ""
        self._last = -DELTA_INTERVAL_S
        self._listener = listener

    def assistant_delta(self, text: str) -> None:
        if shown := self._silent.feed(text):
            self._held += shown
            if self._clock() - self._last >= DELTA_INTERVAL_S:
                self._write_held()

    def _write_held(self) -> None:
        if self._held:
            self._events.emit(AssistantDelta(delta=self._held))
            if self._listener is not None:
                self._listener.text(self._held)
            self._held = ""
            self._last = self._clock()

    def flush(self) -> None:
        self._held += self._silent.flush()
        self._write_held()

    def tool_start(self, call: ToolCall) -> None:
        self._write_held()
        if self._listener is not None:
            self._listener.boundary()
        self._events.emit(ToolStarted(name=call.name, call_id=call.id,
                                      args=call.arguments if self._verbose else None))

    def tool_update(self, call: ToolCall, text: str) -> None:
        self.emit(ToolUpdated(name=call.name, call_id=call.id,
                              text=text if self._verbose else None))

    def tool_result(self, call: ToolCall, result: ToolResult) -> None:
        self.emit(tool_finished(call.name, call.id, result, verbose=self._verbose))

    def diagnostic(self, kind: str, **data: Any) -> None:
        self.emit(Diagnostic(kind=kind, values=data))

    def thinking(self, text: str) -> None:
        if self._thinking:
            self.emit(Thinking(text=text[:20_000]))

    def emit(self, event: RunEventRecord) -> None:
        """Any other event of the turn, after the text held so far."""
        self._write_held()
        self._events.emit(event)

    def routing(self, kind: RoutingEventKind, /, **data: Any) -> None:
        """Retries and failovers: a diagnostic run event and a Prometheus counter."""
        self.emit(RoutingRetry(**data) if kind == "retry" else RoutingFailover(**data))
        if kind == "retry":
            metrics.count_retry(
                _provider_of(data.get("route")),
                "transient" if data.get("initial") else "continuation",
            )
        elif kind == "failover":
            metrics.count_failover(_provider_of(data.get("from_route")), _provider_of(data.get("to_route")))


def tool_finished(name: str, call_id: str, result: ToolResult, *, verbose: bool) -> ToolFinished:
    """A tool call's result event (its content cut to 2000 characters, when ``verbose``)."""
    return ToolFinished(name=name, call_id=call_id, is_error=result.is_error,
                        result=result.content[:2000] if verbose else None)


def emit_end(events: RunEvents, record: RunRecord) -> None:
    """The run's one terminal lifecycle event."""
    if record.status is RunStatus.error:
        events.emit(RunFailed(ended_at=record.ended_at, error=record.error))
    else:
        events.emit(RunEnded(ended_at=record.ended_at, status=record.status.value,
                             reply=record.reply))


class NoEvents:
    """Events nobody watches: a loop run that is not a live turn (a replay, a fork, an eval
    case, a test) reports nothing."""

    def assistant_delta(self, text: str) -> None: ...

    def tool_start(self, call: ToolCall) -> None: ...

    def tool_update(self, call: ToolCall, text: str) -> None: ...

    def tool_result(self, call: ToolCall, result: ToolResult) -> None: ...

    def diagnostic(self, kind: str, **data: Any) -> None: ...

    def thinking(self, text: str) -> None: ...
