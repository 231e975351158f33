"""Recording a turn: what its loop sent and received, written as it happens.

:class:`Recorder` is one per process (its Redis, the ``[recorder]`` settings and the secrets to
mask). Around each run of a turn's loop it wraps the provider (:class:`RecordingProvider`:
every model call's request and response, or error) and the tools (:class:`RecordingTools`:
every tool call that ran, with its result); the turn's start (:meth:`Recorder.start`) and end
(:meth:`Recorder.end`) write what the loop alone does not see. A write is one script call
(``record_append.lua``); a record past ``max_bytes`` stops growing. Recording never fails a
turn: a write that fails is logged and the turn goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

import redis

from fermix_shared import recorder as rec
from fermix_shared import tracing
from fermix_shared.errors import ProviderError
from fermix_shared.logs import RedactSecrets, secret_values
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.settings import Settings
from fermix_worker.loop import LoopTools
from fermix_worker.loop_state import LoopState, turn_text
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ProviderState, ToolSpec
from fermix_worker.tools.base import Tool, ToolResult
from fermix_worker.tools.context import RunContext

if TYPE_CHECKING:
    from fermix_worker.loop import CompletingProvider
    from fermix_worker.turn.prepare import TurnInputs

log = logging.getLogger(__name__)


class Recorder:
    """Writes turns' records (module docstring); off (``[recorder] enabled = false``) it wraps
    nothing and writes nothing."""

    def __init__(self, r: redis.Redis, settings: Settings):
        self._r, self._config = r, settings.recorder
        self._mask = RedactSecrets(secret_values(settings)).redact

    @property
    def enabled(self) -> bool:
        return self._config.enabled

    def write(self, run_id: str, entry: rec.Entry, via: redis.client.Pipeline | None = None
              ) -> None:
        """Append ``entry`` to the run's record (masked); a failed write is logged only.
        ``via``: queued on that pipeline instead, which the caller runs (and whose result for
        this write it ignores)."""
        if not self._config.enabled:
            return
        if via is not None:
            rec.append(via, run_id, entry, self._config, self._mask)
            return
        try:
            with tracing.span("fermix.record", {"fermix.record.entry": entry.k}):
                rec.append(self._r, run_id, entry, self._config, self._mask)
        except redis.RedisError as e:
            log.warning("the recorder could not write run %s's record: %s", run_id, e)

    def start(self, inputs: TurnInputs, system_prompt: str, memory_files: str,
              via: redis.client.Pipeline | None = None) -> None:
        """What the turn is built from (see :class:`~fermix_shared.recorder.Start`)."""
        self.write(inputs.messages[0].run_id, start_entry(inputs, system_prompt, memory_files),
                   via)

    def provider(self, provider: CompletingProvider, state: LoopState) -> CompletingProvider:
        """``provider`` with its calls for ``state``'s turn recorded."""
        return RecordingProvider(provider, self, state) if self.enabled else provider

    def tools(self, tools: LoopTools, run_id: str) -> LoopTools:
        """``tools`` with the calls that run recorded."""
        return RecordingTools(tools, self, run_id) if self.enabled else tools

    def steered(self, state: LoopState, texts: list[str]) -> None:
        if texts:
            self.write(state.run_id, rec.Steer(i=state.iteration, texts=texts))

    def end(self, state: LoopState, final: bool, reply: str,
            via: redis.client.Pipeline | None = None) -> None:
        """How the turn ended, and every answer its transcript holds (``via``: as
        :meth:`write`)."""
        if self.enabled:
            self.write(state.run_id, end_entry(state, final, reply), via)


def start_entry(inputs: TurnInputs, system_prompt: str, memory_files: str) -> rec.Start:
    return rec.Start(
        at=time.time(), messages=inputs.messages, history=inputs.history,
        system_prompt=system_prompt, memory_files=memory_files,
        prompt_system=inputs.prompt.system, prompt_prepend=inputs.prompt.prepend,
        facts=inputs.facts, skills=inputs.skills, now=inputs.now.timestamp(),
        model=inputs.model, route_override=inputs.route_override)


def end_entry(state: LoopState, final: bool, reply: str) -> rec.End:
    calls = {c.id: c for m in state.messages[state.turn_start:] for c in m.tool_calls}
    answers = {
        m.tool_call_id: rec.ToolRun(call=calls[m.tool_call_id], content=m.content,
                                    is_error=m.is_error)
        for m in state.messages[state.turn_start:]
        if m.role == "tool" and m.tool_call_id in calls
    }
    return rec.End(outcome="final" if final else "failed", reply=reply, text=turn_text(state, reply if final else ""),
                   approvals=dict(state.approvals), answers=answers)


def request_entry(request: ModelRequest, previous: ModelRequest | None) -> rec.Request:
    """``request`` as recorded after ``previous`` (the last one this process recorded for the
    turn): the system prompt and tools only when they changed, the messages past the common
    prefix."""
    same = 0
    if previous is not None:
        for old, new in zip(previous.messages, request.messages, strict=False):
            if old != new:
                break
            same += 1
    return rec.Request(
        model=request.model,
        system=None if previous is not None and previous.system == request.system
        else request.system,
        tools=None if previous is not None and previous.tools == request.tools
        else [asdict(t) for t in request.tools],
        messages_from=same, messages=list(request.messages[same:]),
        max_tokens=request.max_tokens, reasoning_effort=request.reasoning_effort,
        temperature=request.temperature)


def snapshot(request: ModelRequest) -> ModelRequest:
    """``request`` with its own copy of the messages (the loop's request shares the state's
    list, which grows, and a compaction may rewrite a message in place)."""
    return replace(request, messages=[m.model_copy(deep=True) for m in request.messages])


def response_entry(turn: ModelTurn) -> rec.Response:
    return rec.Response(
        content=turn.content, tool_calls=turn.tool_calls, input_tokens=turn.input_tokens,
        output_tokens=turn.output_tokens, model=turn.model, route=turn.route,
        route_model=turn.route_model, thinking=turn.thinking,
        cache_read_tokens=turn.cache_read_tokens, cache_write_tokens=turn.cache_write_tokens,
        reasoning_tokens=turn.reasoning_tokens)


def error_entry(e: ProviderError) -> rec.CallError:
    return rec.CallError(type=type(e).__name__, message=str(e), provider=e.provider,
                         status=e.status, transient=e.transient)


class RecordingProvider:
    """A turn's provider, its calls recorded under the turn's call index."""

    def __init__(self, inner: CompletingProvider, recorder: Recorder, state: LoopState):
        self._inner, self._recorder, self._state = inner, recorder, state
        self._previous: ModelRequest | None = None

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._recorded(request, lambda: self._inner.chat(request, on_delta))

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._recorded(
            opts, lambda: self._inner.continue_(provider_state, tool_results, opts, on_delta))

    def _recorded(self, request: ModelRequest, call: Callable[[], ModelTurn]) -> ModelTurn:
        started, i = time.time(), self._state.iteration
        entry = request_entry(request, self._previous)
        try:
            turn = call()
        except ProviderError as e:
            self._write(i, started, entry, error=error_entry(e))
            self._previous = snapshot(request)
            raise
        self._write(i, started, entry, response=response_entry(turn))
        self._previous = snapshot(request)
        return turn

    def _write(self, i: int, started: float, request: rec.Request, *,
               response: rec.Response | None = None, error: rec.CallError | None = None) -> None:
        self._recorder.write(self._state.run_id, rec.ModelCall(
            i=i, at=started, ms=int((time.time() - started) * 1000), request=request,
            response=response, error=error))


class RecordingTools:
    """A turn's tools, each call that runs recorded with its result."""

    def __init__(self, inner: LoopTools, recorder: Recorder, run_id: str):
        self._inner, self._recorder, self._run_id = inner, recorder, run_id

    def specs(self) -> list[ToolSpec]:
        return self._inner.specs()

    def get(self, name: str) -> Tool | None:
        return self._inner.get(name)

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult:
        started = time.time()
        result = self._inner.execute(call, ctx)
        self._recorder.write(self._run_id, rec.ToolRun(
            call=call, content=result.content, is_error=result.is_error,
            ms=int((time.time() - started) * 1000)))
        return result
