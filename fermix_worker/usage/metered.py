"""The provider router, metered: every model call that answered is charged to its attribution.

Metering wraps the router rather than living in it (as pydantic-ai's ``WrapperModel`` wraps a
model): the routing rules know nothing of usage, and what is metered is decided where a router
is handed out, :meth:`fermix_worker.runtime.Runtime.router` (turns, compaction, the memory
review) and the subagent runner's per-job chains. A call is charged when the chain returns it:
one call per answered ``chat``, ``continue_`` or ``complete`` (retries and failovers that
raised cost nothing, as a failed call reports no usage), priced by the route's configured
model, then the provider-reported one. Before it, the call's worst case (the prompt as sent,
estimated, plus ``max_tokens``) is reserved against every budget of its scopes, fleet-wide;
one that does not fit is not made (:class:`~fermix_shared.errors.BudgetCutOff`). Each call
made, answered or failed, is added to its run's timeline with its latency and cost
(fermix_shared/stores/timeline.py).
Who it is charged to is bound explicitly where a caller takes its router
(:func:`charged_to`: the turn, its compaction, a memory review, a subagent or skill run for its
parent); the per-turn routers and a hook's chain made from it keep that attribution.

Each call is also one span (fermix_shared/tracing.py) when tracing is on, child of whatever
span is current (the turn's, a subagent's), with the OpenTelemetry GenAI attributes: the
operation (``chat``), the provider that answered, the models asked for and answered, the
tokens (cached input apart), why the model stopped, and the cost (``fermix.cost_usd``).
Tracing on and usage off, :func:`metered` still wraps the router, to trace only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from fermix_shared import tracing
from fermix_shared.messages import ChatMessage
from fermix_shared.stores.timeline import ModelCall
from fermix_shared.usage.scopes import Attribution
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ProviderState
from fermix_worker.providers.routing import BoundRoute, OnEvent, Router
from fermix_worker.usage.meter import UsageMeter


class MeteredProvider:
    """``inner`` with each answered call charged to ``meter``, in the scopes of ``charged``
    (None: ``total`` only), and traced; its per-turn routers too. Without a meter (usage
    off, tracing on) it only traces."""

    def __init__(self, inner: Router, meter: UsageMeter | None,
                 charged: Attribution | None = None) -> None:
        self._inner = inner
        self._meter = meter
        self._charged = charged

    def charged_to(self, who: Attribution) -> MeteredProvider:
        """This router with its calls charged to ``who``."""
        return MeteredProvider(self._inner, self._meter, who)

    def for_turn(
        self,
        *,
        on_event: OnEvent | None = None,
        sleep: Callable[[float], None] | None = None,
        pinned: str | None = None,
    ) -> MeteredProvider:
        return MeteredProvider(
            self._inner.for_turn(on_event=on_event, sleep=sleep, pinned=pinned), self._meter,
            self._charged)

    def with_primary(self, bound: BoundRoute) -> MeteredProvider:
        return MeteredProvider(self._inner.with_primary(bound), self._meter, self._charged)

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._metered(request, on_delta, lambda d: self._inner.chat(request, d))

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._metered(opts, on_delta, lambda d: self._inner.continue_(
            provider_state, tool_results, opts, d))

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool) -> ModelTurn:
        return self._metered(request, on_delta, lambda d: self._inner.complete(
            request, d, initial=initial))

    def _metered(self, request: ModelRequest, on_delta: OnDelta,
                 call: Callable[[OnDelta], ModelTurn]) -> ModelTurn:
        """The call, in its span (module docstring); with tracing on, the span says when the
        first streamed text came (``fermix.ttft_ms``, from the call's start)."""
        with tracing.span(f"chat {request.model}", request_attributes(request, self._charged),
                          kind=tracing.SpanKind.CLIENT) as span:
            first: list[int] = []
            if span.is_recording():
                started_ns, inner = time.time_ns(), on_delta

                def on_delta(delta: str) -> None:
                    if not first:
                        first.append(time.time_ns() - started_ns)
                    inner(delta)

            def bound() -> ModelTurn:
                return call(on_delta)

            turn, usd = (bound(), None) if self._meter is None else self._charged_call(
                self._meter, request, bound)
            if span.is_recording():
                span.set_attributes(response_attributes(turn, usd))
                if first:
                    span.set_attribute("fermix.ttft_ms", round(first[0] / 1e6, 3))
            return turn

    def _charged_call(self, meter: UsageMeter, request: ModelRequest,
                      call: Callable[[], ModelTurn]) -> tuple[ModelTurn, int]:
        """Reserve the call's worst case (refused: BudgetCutOff, nothing called), make it,
        settle the reservation with the reported usage (or release it if the call failed);
        the turn and its cost (micro-dollars)."""
        reservation = meter.reserve(request.model, prompt_tokens(request),
                                    request.max_tokens, self._charged)
        started = time.time()
        kind = self._charged.kind if self._charged else "turn"
        try:
            turn = call()
        except BaseException as e:
            meter.release(reservation)
            if isinstance(e, Exception):  # not an interrupt thrown into a blocked greenlet
                meter.note_call(self._charged, ModelCall(
                    int(started * 1000), _ms_since(started), kind, request.model,
                    error=f"{type(e).__name__}: {e}"[:300]))
            raise
        latency_ms = _ms_since(started)
        usd = meter.charge((turn.route_model, turn.model), turn.input_tokens,
                           turn.output_tokens, self._charged, reservation,
                           cache_read=turn.cache_read_tokens,
                           cache_write=turn.cache_write_tokens,
                           reasoning=turn.reasoning_tokens,
                           timeline_entry=lambda usd: ModelCall(
                               int(started * 1000), latency_ms, kind,
                               turn.model or request.model, turn.input_tokens,
                               turn.output_tokens, turn.cache_read_tokens,
                               turn.cache_write_tokens, turn.reasoning_tokens, usd))
        return turn, usd


def request_attributes(request: ModelRequest, who: Attribution | None) -> dict[str, Any]:
    """A model call's span attributes known before it is made (never the prompt)."""
    out: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": request.model,
                           "gen_ai.request.max_tokens": request.max_tokens}
    if request.temperature is not None:
        out["gen_ai.request.temperature"] = request.temperature
    if who is not None:
        out.update({"fermix.run_id": who.run_id, "fermix.agent": who.agent,
                    "fermix.call_kind": who.kind})
    return out


def response_attributes(turn: ModelTurn, usd_micros: int | None) -> dict[str, Any]:
    """What the answered call reported, for its span (never the answer's text)."""
    out: dict[str, Any] = {
        "gen_ai.response.model": turn.model or turn.route_model,
        "gen_ai.usage.input_tokens": turn.input_tokens,
        "gen_ai.usage.output_tokens": turn.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": turn.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": turn.cache_write_tokens,
        "gen_ai.usage.reasoning.output_tokens": turn.reasoning_tokens,
        "fermix.tool_calls": len(turn.tool_calls),
    }
    if turn.provider:
        # The current name, and the older one that many backends still read.
        out["gen_ai.provider.name"] = out["gen_ai.system"] = turn.provider
    if turn.route:
        out["fermix.route"] = turn.route
    if turn.finish_reason:
        out["gen_ai.response.finish_reasons"] = [turn.finish_reason]
    if usd_micros is not None:
        out["fermix.cost_usd"] = usd_micros / 1_000_000
    return out


def _ms_since(started: float) -> int:
    return max(0, int((time.time() - started) * 1000))


# Characters per token of the reservation's estimate: fewer than English's ~4, so a prompt in
# a denser script is not under-reserved by much; what the provider reports settles it.
CHARS_PER_TOKEN = 3


def prompt_tokens(request: ModelRequest) -> int:
    """The prompt as sent, estimated in tokens (system, messages, tool calls, tool schemas)."""
    chars = len(request.system) + sum(
        len(m.content) + sum(len(json.dumps(c.arguments)) + len(c.name) for c in m.tool_calls)
        for m in request.messages)
    chars += sum(len(t.name) + len(t.description) + len(json.dumps(t.parameters))
                 for t in request.tools)
    return -(-chars // CHARS_PER_TOKEN)


def metered(router: Router, meter: UsageMeter | None) -> Router:
    """``router`` metered by ``meter`` (and traced); as it is when usage is not counted (no
    meter) and tracing is off."""
    if meter is None and not tracing.enabled():
        return router
    return MeteredProvider(router, meter)


def charged_to(router: Router, who: Attribution) -> Router:
    """``router`` with its calls charged to ``who``; an unmetered router (usage off) as it is."""
    return router.charged_to(who) if isinstance(router, MeteredProvider) else router
