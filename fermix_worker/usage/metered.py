"""The provider router, metered: every model call that answered is charged to its attribution.

Metering wraps the router rather than living in it (as pydantic-ai's ``WrapperModel`` wraps a
model): the routing rules know nothing of usage, and what is metered is decided where a router
is handed out, :meth:`fermix_worker.runtime.Runtime.router` (turns, compaction, the memory
review) and the subagent runner's per-job chains. A call is charged when the chain returns it:
one call per answered ``chat``, ``continue_`` or ``complete`` (retries and failovers that
raised cost nothing, as a failed call reports no usage), priced by the route's configured
model, then the provider-reported one.
Who it is charged to is bound explicitly where a caller takes its router
(:func:`charged_to`: the turn, its compaction, a memory review, a subagent or skill run for its
parent); the per-turn routers and a hook's chain made from it keep that attribution.
"""

from __future__ import annotations

from collections.abc import Callable

from fermix_shared.messages import ChatMessage
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
        return self._charge(self._inner.chat(request, on_delta))

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        return self._charge(self._inner.continue_(provider_state, tool_results, opts, on_delta))

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool) -> ModelTurn:
        return self._charge(self._inner.complete(request, on_delta, initial=initial))

    def _charge(self, turn: ModelTurn) -> ModelTurn:
        self._meter.charge((turn.route_model, turn.model), turn.input_tokens, turn.output_tokens,
                           self._charged)
        return turn


def metered(router: Router, meter: UsageMeter | None) -> Router:
    """``router`` metered by ``meter``; as it is when usage is not counted (no meter)."""
    return router if meter is None else MeteredProvider(router, meter)


def charged_to(router: Router, who: Attribution) -> Router:
    """``router`` with its calls charged to ``who``; an unmetered router (usage off) as it is."""
    return router.charged_to(who) if isinstance(router, MeteredProvider) else router
