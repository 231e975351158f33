"""The replay's stand-ins (fermix_worker/recorder/replay.py): a provider that compares each
request the loop makes with the one recorded under the same call index and answers with the
recorded response (or its recorded error), and tools that compare each call with the recorded
one and answer with its recorded result. A difference is :class:`Diverged`, naming what
differs and both sides; with ``strict=False`` (a fork's first steps) they answer by index and
call id without comparing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fermix_shared import errors
from fermix_shared import recorder as rec
from fermix_shared.errors import FermixError, ProviderError
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.loop import LoopTools
from fermix_worker.loop_state import LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ProviderState, ToolSpec
from fermix_worker.tools.base import Tool, ToolResult
from fermix_worker.tools.context import RunContext


class Diverged(FermixError):
    """The turn as replayed left the record here."""

    def __init__(self, what: str, recorded: str = "", now: str = ""):
        super().__init__(what)
        self.what, self.recorded, self.now = what, recorded, now


def request_json(request: ModelRequest) -> dict[str, Any]:
    """A request in the record's terms (its full form)."""
    return {
        "model": request.model, "system": request.system,
        "tools": [asdict(t) for t in request.tools],
        "messages": [m.model_dump(exclude_none=True) for m in request.messages],
        "max_tokens": request.max_tokens, "reasoning_effort": request.reasoning_effort,
        "temperature": request.temperature,
    }


def recorded_json(request: rec.Request) -> dict[str, Any]:
    return {
        "model": request.model, "system": request.system, "tools": request.tools or [],
        "messages": [m.model_dump(exclude_none=True) for m in request.messages],
        "max_tokens": request.max_tokens, "reasoning_effort": request.reasoning_effort,
        "temperature": request.temperature,
    }


def excerpt(a: str, b: str) -> tuple[int, str, str]:
    """Where two texts first differ, and 60 characters of each from a little before it."""
    i = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, i - 20)
    return i, a[lo:lo + 60], b[lo:lo + 60]


def describe(recorded: dict[str, Any], now: dict[str, Any]) -> Diverged | None:
    """The first difference between a recorded request and today's, in words."""
    for name in ("model", "max_tokens", "reasoning_effort", "temperature"):
        if recorded[name] != now[name]:
            return Diverged(f"the request's {name.replace('_', ' ')} differs",
                            repr(recorded[name]), repr(now[name]))
    if recorded["system"] != now["system"]:
        i, a, b = excerpt(recorded["system"] or "", now["system"] or "")
        return Diverged(f"the system prompt differs at character {i + 1}", a, b)
    if recorded["tools"] != now["tools"]:
        old = {t["name"]: t for t in recorded["tools"]}
        new = {t["name"]: t for t in now["tools"]}
        if set(old) != set(new):
            return Diverged("the tools offered differ", ", ".join(sorted(old)),
                            ", ".join(sorted(new)))
        changed = next(n for n in old if old[n] != new[n])
        return Diverged(f"the tool {changed!r}'s description or schema differs",
                        json.dumps(old[changed])[:200], json.dumps(new[changed])[:200])
    a, b = recorded["messages"], now["messages"]
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            j, ra, rb = excerpt(json.dumps(x), json.dumps(y))
            return Diverged(f"message {i + 1} of the request ({x.get('role')}) differs", ra, rb)
    if len(a) != len(b):
        return Diverged("the request's messages differ in number", str(len(a)), str(len(b)))
    return None


def _error(e: rec.CallError) -> ProviderError:
    """The recorded call's error, as the loop saw it (its class when it takes the base's
    arguments)."""
    cls = getattr(errors, e.type, ProviderError)
    if isinstance(cls, type) and issubclass(cls, ProviderError):
        try:
            return cls(e.message, provider=e.provider, status=e.status, transient=e.transient)
        except TypeError:
            pass
    return ProviderError(e.message, provider=e.provider, status=e.status, transient=e.transient)


class ReplayProvider:
    """Answers each model call with the recorded response of the same index, after checking
    (``strict``) that the request is the recorded one."""

    def __init__(self, recording: rec.Recording, state: LoopState, *, strict: bool = True,
                 mask: Callable[[str], str] = lambda text: text):
        self._recording, self._state, self._strict, self._mask = recording, state, strict, mask
        self._requests = recording.requests()

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._answer(request, on_delta)

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._answer(opts, on_delta)

    def injected(self) -> list[str]:
        """The messages a steer-mode turn took in before this call."""
        return list(self._recording.steers.get(self._state.iteration, []))

    def _answer(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        i = self._state.iteration
        call = self._recording.calls.get(i)
        if call is None:
            raise Diverged(f"the turn makes model call {i + 1}; the record has "
                           f"{len(self._recording.calls)}")
        if self._strict:
            now = json.loads(self._mask(json.dumps(request_json(request))))
            found = describe(recorded_json(self._requests[i]), now)
            if found is not None:
                raise found
        if call.error is not None:
            raise _error(call.error)
        assert call.response is not None
        r = call.response
        if r.content:
            on_delta(r.content)
        return ModelTurn(
            content=r.content, tool_calls=list(r.tool_calls), input_tokens=r.input_tokens,
            output_tokens=r.output_tokens, model=r.model, route=r.route,
            route_model=r.route_model, thinking=r.thinking, provider_state=None,
            cache_read_tokens=r.cache_read_tokens, cache_write_tokens=r.cache_write_tokens,
            reasoning_tokens=r.reasoning_tokens)


def recorded_result(recording: rec.Recording, call_id: str) -> rec.ToolRun | None:
    """A call's recorded result: the run's own, else its answer in the turn's transcript."""
    found = recording.tools.get(call_id)
    if found is None and recording.end is not None:
        found = recording.end.answers.get(call_id)
    return found


class ReplayTools:
    """Today's tools as the model sees them; each call answered by its recorded result after
    checking that it is the recorded call (no tool runs)."""

    def __init__(self, inner: LoopTools, recording: rec.Recording):
        self._inner, self._recording = inner, recording

    def specs(self) -> list[ToolSpec]:
        return self._inner.specs()

    def get(self, name: str) -> Tool | None:
        return self._inner.get(name)

    def execute(self, call: ToolCall, ctx: RunContext) -> ToolResult:
        found = recorded_result(self._recording, call.id)
        if found is None:
            raise Diverged(f"the call {call.name} ({call.id}) has no recorded result")
        if (found.call.name, found.call.arguments) != (call.name, call.arguments):
            raise Diverged(f"the call {call.id} differs",
                           f"{found.call.name} {json.dumps(found.call.arguments)}",
                           f"{call.name} {json.dumps(call.arguments)}")
        return ToolResult(found.content, found.is_error)
