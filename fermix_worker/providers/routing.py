"""RoutedProvider: the provider chain with the seed's retry and failover rules.

Initial call (:meth:`~RoutedProvider.chat`), route by route from the primary:

* a transient infrastructure error (connection refused/reset, transport timeout/close, HTTP
  5xx incl. 529) is retried on the same route, at most twice, after 0.5 s and then 1 s;
* then, and at once for any other error (429, quota, 400/401/403/404, ...), the call fails
  over to the next route. Any error qualifies: the seed restricts failover only to the initial
  call with nothing delivered, and a bad key or an unknown model on one route is exactly what a
  fallback with its own key and model can get past;
* none of this once streamed content reached ``on_delta``: that failure is terminal as is.

Continuation call (:meth:`~RoutedProvider.continue_`, with the adapter's state): the route that answered the turn's initial call, never
another. Only a timeout before any response data arrived is re-issued, at most twice, after
2 s and then 4 s; every other error is terminal on its first occurrence.

Terminal errors propagate as :class:`ProviderError`; :class:`AllProvidersFailed` when the chain
has several routes and all of them failed. :func:`~fermix_worker.providers.failures.failure_message`
turns any of them into the user's reply.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fermix_shared import metrics
from fermix_shared.errors import AllProvidersFailed, ProviderError, ProviderUnavailable
from fermix_shared.messages import ChatMessage
from fermix_worker.providers.base import ModelRequest, ModelTurn, OnDelta, Provider, ProviderState
from fermix_worker.providers.failures import failure_message, short_reason
from fermix_worker.providers.routes import ProviderRoute

__all__ = [
    "CONTINUATION_RETRY_DELAYS",
    "INITIAL_RETRY_DELAYS",
    "BoundRoute",
    "OnEvent",
    "RoutedProvider",
    "Router",
    "RoutingEventKind",
    "failure_message",
    "wall_sleep",
]

INITIAL_RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0)
CONTINUATION_RETRY_DELAYS: tuple[float, ...] = (2.0, 4.0)

RoutingEventKind = Literal["retry", "failover"]


def wall_sleep(seconds: float) -> None:
    """``time.sleep`` looked up at call time, so gevent's patched one is used in workers even
    when this module was imported before ``monkey.patch_all()``."""
    time.sleep(seconds)


class OnEvent(Protocol):
    """Observability hook. Kinds and their data:

    * ``retry``: ``route`` (name), ``attempt`` (1 or 2: which retry this is), ``delay``
      (seconds about to be slept), ``reason`` (short), ``initial`` (which rule applied);
    * ``failover``: ``from_route``, ``to_route`` (names), ``reason`` (short).
    """

    def __call__(self, kind: RoutingEventKind, /, **data: Any) -> None: ...


class Router(Protocol):
    """What callers reach a model through: the chain itself (:class:`RoutedProvider`) or a
    wrapper of it (the usage meter's, ``fermix_worker/usage/metered.py``)."""

    def for_turn(
        self,
        *,
        on_event: OnEvent | None = None,
        sleep: Callable[[float], None] | None = None,
        pinned: str | None = None,
    ) -> Router:
        """A router for one turn (see :meth:`RoutedProvider.for_turn`)."""
        ...

    def with_primary(self, bound: BoundRoute) -> Router:
        """This chain with ``bound`` first (see :meth:`RoutedProvider.with_primary`)."""
        ...

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """A turn's first call through the chain (see :meth:`RoutedProvider.chat`)."""
        ...

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """A continuation (see :meth:`RoutedProvider.continue_`)."""
        ...

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool) -> ModelTurn:
        """One call from the neutral transcript (see :meth:`RoutedProvider.complete`)."""
        ...


# One adapter call (chat, or continue_ with its state bound), on the request of a route.
_AdapterCall = Callable[[Provider, ModelRequest, OnDelta], ModelTurn]


@dataclass(frozen=True)
class BoundRoute:
    """A route and the adapter that serves it."""

    route: ProviderRoute
    adapter: Provider


class RoutedProvider:
    """The provider chain behind one ``complete`` call.

    Continuations go to the route that answered the last successful initial call of *this
    object* (its pin), so use one object per turn: :meth:`for_turn` makes one cheaply, sharing
    routes and clients. A turn resumed in another process passes the answering route's name
    (``ModelTurn.route``) back as ``pinned``. Unpinned continuations use the primary.
    """

    name = "router"

    def __init__(
        self,
        routes: Sequence[BoundRoute],
        *,
        sleep: Callable[[float], None] = wall_sleep,
        on_event: OnEvent | None = None,
        pinned: str | None = None,
    ) -> None:
        if not routes:
            raise ValueError("RoutedProvider needs at least one route")
        self._routes = tuple(routes)
        self._sleep = sleep
        self._on_event = on_event
        self._pin = self._index_of(pinned)

    @property
    def routes(self) -> tuple[ProviderRoute, ...]:
        """The chain, primary first."""
        return tuple(b.route for b in self._routes)

    @property
    def pinned(self) -> str | None:
        """Name of the route continuations go to, once an initial call has succeeded."""
        return None if self._pin is None else self._routes[self._pin].route.name

    def for_turn(
        self,
        *,
        on_event: OnEvent | None = None,
        sleep: Callable[[float], None] | None = None,
        pinned: str | None = None,
    ) -> RoutedProvider:
        """A router for one turn: same routes and clients, its own events, sleep and pin."""
        return RoutedProvider(
            self._routes,
            sleep=sleep or self._sleep,
            on_event=on_event or self._on_event,
            pinned=pinned,
        )

    def with_primary(self, bound: BoundRoute) -> RoutedProvider:
        """This chain with ``bound`` as its primary, the configured fallbacks after it (a
        ``before_model_resolve`` hook's choice of provider and model for one turn)."""
        return RoutedProvider(
            (bound, *self._routes[1:]), sleep=self._sleep, on_event=self._on_event
        )

    def chat(self, request: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """A turn's first model call (failover-eligible); the route's model replaces
        ``request.model``. Returns the turn with ``route`` set to the answering route's name;
        raises the terminal :class:`ProviderError`."""
        return self._initial(lambda a, r, d: a.chat(r, d), request, on_delta)

    def continue_(self, provider_state: ProviderState | None, tool_results: list[ChatMessage],
                  opts: ModelRequest, on_delta: OnDelta) -> ModelTurn:
        """A continuation after tool results, on the pinned route, from ``provider_state``
        (the last call's) and the messages added since."""
        return self._continuation(
            lambda a, r, d: a.continue_(provider_state, tool_results, r, d), opts, on_delta)

    def complete(self, request: ModelRequest, on_delta: OnDelta, *, initial: bool) -> ModelTurn:
        """One call from the neutral transcript alone (a one-shot: a summary, a review):
        ``initial`` as :meth:`chat`, else a continuation that carries no state."""
        if initial:
            return self.chat(request, on_delta)
        return self.continue_(None, [], request, on_delta)

    def _index_of(self, name: str | None) -> int | None:
        if name is None:
            return None
        for i, b in enumerate(self._routes):
            if b.route.name == name:
                return i
        return None  # the chain changed since the turn started: continue on the primary

    def _emit(self, kind: RoutingEventKind, **data: Any) -> None:
        if self._on_event is not None:
            self._on_event(kind, **data)

    def _call(self, index: int, call: _AdapterCall, request: ModelRequest, on_delta: OnDelta
              ) -> ModelTurn:
        bound = self._routes[index]
        # Every attempt is one model call on the latency histogram, a failed one included.
        with metrics.time_provider_call(bound.route.provider, bound.route.model):
            turn = call(bound.adapter, dataclasses.replace(request, model=bound.route.model),
                        on_delta)
        return dataclasses.replace(turn, route=bound.route.name, route_model=bound.route.model,
                                   provider=bound.route.provider)

    def _initial(self, call: _AdapterCall, request: ModelRequest, on_delta: OnDelta
                 ) -> ModelTurn:
        failures: list[tuple[str, ProviderError]] = []
        for index, bound in enumerate(self._routes):
            retries = 0
            while True:
                delivered = False

                def tracked(text: str) -> None:
                    nonlocal delivered
                    delivered = True
                    on_delta(text)

                try:
                    turn = self._call(index, call, request, tracked)
                except ProviderError as e:
                    if delivered:
                        raise  # the user saw part of this answer: no retry, no failover
                    if e.transient and retries < len(INITIAL_RETRY_DELAYS):
                        delay = INITIAL_RETRY_DELAYS[retries]
                        retries += 1
                        self._emit("retry", route=bound.route.name, attempt=retries,
                                   delay=delay, reason=short_reason(e), initial=True)  # fmt: skip
                        self._sleep(delay)
                        continue
                    failures.append((bound.route.name, e))
                    if index + 1 < len(self._routes):
                        self._emit("failover", from_route=bound.route.name,
                                   to_route=self._routes[index + 1].route.name,
                                   reason=short_reason(e))  # fmt: skip
                    break
                self._pin = index
                return turn
        if len(failures) == 1:
            raise failures[0][1]
        raise AllProvidersFailed(failures)

    def _continuation(self, call: _AdapterCall, request: ModelRequest, on_delta: OnDelta
                      ) -> ModelTurn:
        index = self._pin if self._pin is not None else 0
        name = self._routes[index].route.name
        for attempt, delay in enumerate((*CONTINUATION_RETRY_DELAYS, None), start=1):
            try:
                return self._call(index, call, request, on_delta)
            except ProviderUnavailable as e:
                # Only a call that provably produced nothing is safe to send again.
                if delay is None or not e.timeout or e.bytes_received:
                    raise
                self._emit("retry", route=name, attempt=attempt, delay=delay,
                           reason=short_reason(e), initial=False)  # fmt: skip
                self._sleep(delay)
        raise AssertionError("unreachable")  # the last attempt returns or raises
