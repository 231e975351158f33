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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from fermix_shared.messages import ChatMessage
from fermix_shared.stores.timeline import ModelCall
from fermix_shared.usage.scopes import Attribution
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, ProviderState
from fermix_worker.providers.routing import BoundRoute, OnEvent, Router
from fermix_worker.usage.meter import UsageMeter


class MeteredProvider:
    """``inner`` with each answered call charged to ``meter``, in the scopes of ``charged``
    (None: ``total`` only); its per-turn routers too."""

    def __init__(self, inner: Router, meter: UsageMeter,
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
        return self._metered(request, lambda: self._inner.chat(request, on_delta))

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._metered(
            opts, lambda: self._inner.continue_(provider_state, tool_results, opts, on_delta))

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool) -> ModelTurn:
        return self._metered(request, lambda: self._inner.complete(request, on_delta,
                                                                   initial=initial))

    def _metered(self, request: ModelRequest, call: Callable[[], ModelTurn]) -> ModelTurn:
        """Reserve the call's worst case (refused: BudgetCutOff, nothing called), make it,
        settle the reservation with the reported usage (or release it if the call failed)."""
        reservation = self._meter.reserve(request.model, prompt_tokens(request),
                                          request.max_tokens, self._charged)
        started = time.time()
        kind = self._charged.kind if self._charged else "turn"
        try:
            turn = call()
        except BaseException as e:
            self._meter.release(reservation)
            if isinstance(e, Exception):  # not an interrupt thrown into a blocked greenlet
                self._meter.note_call(self._charged, ModelCall(
                    int(started * 1000), _ms_since(started), kind, request.model,
                    error=f"{type(e).__name__}: {e}"[:300]))
            raise
        usd = self._meter.charge((turn.route_model, turn.model), turn.input_tokens,
                                 turn.output_tokens, self._charged, reservation,
                                 cache_read=turn.cache_read_tokens,
                                 cache_write=turn.cache_write_tokens,
                                 reasoning=turn.reasoning_tokens)
        self._meter.note_call(self._charged, ModelCall(
            int(started * 1000), _ms_since(started), kind, turn.model or request.model,
            turn.input_tokens, turn.output_tokens, turn.cache_read_tokens,
            turn.cache_write_tokens, turn.reasoning_tokens, usd))
        return turn


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
    """``router`` metered by ``meter``; as it is when usage is not counted (no meter)."""
    return router if meter is None else MeteredProvider(router, meter)


def charged_to(router: Router, who: Attribution) -> Router:
    """``router`` with its calls charged to ``who``; an unmetered router (usage off) as it is."""
    return router.charged_to(who) if isinstance(router, MeteredProvider) else router
