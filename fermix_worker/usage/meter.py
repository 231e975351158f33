"""The usage meter: prices a model call and counts it, once, against its attribution.

The provider router is the one way to a model (turns, subagents and skill runs, compaction,
the memory review, scheduled jobs); the process's routers are metered
(:class:`~fermix_worker.usage.metered.MeteredProvider`, built with the runtime's meter), which
charge each call that answered: the provider-reported tokens, priced by the catalog
(``[prices]`` over the built-in list prices), counted in the scopes of the attribution the
router was charged to (:func:`~fermix_worker.usage.metered.charged_to`) in one Lua script. A
call made with no attribution counts in ``total`` only (and is logged once). Recording never
fails a call: a store error is logged and the call's usage is lost. With usage off there is no
meter, and a router is used unwrapped.

Before each call, :meth:`UsageMeter.reserve` holds its worst case against the budgets of its
scopes (fermix_shared/usage/reserve.py); a call that does not fit is refused with
:class:`~fermix_shared.errors.BudgetCutOff` (its reply names the budget and when it resets),
and :meth:`UsageMeter.charge` settles the reservation with what the provider reported. A store
error while reserving lets the call through (logged): budgets never take the service down.
The same reservation holds the call against its agent's tokens per minute (the token-rate
breaker, fermix_shared/usage/rate.py), refused alike with the rate and when it frees up. A
budget's refusal is handed to ``on_cap`` (the owners' alert, fermix_worker/usage/alerts.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import redis

from fermix_shared import metrics
from fermix_shared.errors import BudgetCutOff
from fermix_shared.settings import Settings
from fermix_shared.stores import timeline
from fermix_shared.stores.timeline import ModelCall
from fermix_shared.usage import budgets, store
from fermix_shared.usage.budgets import BudgetStatus
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.rate import RateLimited, TokenRate, rate_text, rates_of
from fermix_shared.usage.reserve import Refused, Reserved, release, reserve
from fermix_shared.usage.scopes import TOTAL, Attribution

log = logging.getLogger(__name__)


class UsageMeter:
    """Prices and records calls for one process."""

    def __init__(self, r: redis.Redis, catalog: PriceCatalog,
                 clock: Callable[[], float] = time.time, *, hold_s: float = 600.0,
                 rates: Mapping[str, int] | None = None, default_rate: int | None = None,
                 on_cap: Callable[[BudgetStatus], None] | None = None) -> None:
        self._r = r
        # Tokens per minute by agent (the token-rate breaker); an agent not in it: the default.
        self._rates = dict(rates or {})
        self._default_rate = default_rate
        self._on_cap = on_cap
        self._catalog = catalog
        self._clock = clock
        # How long an unsettled reservation holds (its caller died): past any call's end.
        self._hold_s = hold_s
        self._unattributed_logged = False
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, r: redis.Redis, settings: Settings,
                      on_cap: Callable[[BudgetStatus], None] | None = None) -> UsageMeter:
        default = settings.usage.agent_tokens_per_minute
        return cls(r, PriceCatalog(settings.prices),
                   hold_s=max(600.0, 4 * settings.provider_timeout),
                   rates=rates_of(settings.agents, default), default_rate=default,
                   on_cap=on_cap)

    def _rate(self, who: Attribution | None) -> TokenRate | None:
        if who is None or not who.agent:
            return None
        per_minute = self._rates.get(who.agent, self._default_rate)
        return TokenRate(who.agent, per_minute) if per_minute else None

    def reserve(self, model: str, input_tokens: int, max_tokens: int,
                who: Attribution | None) -> str:
        """Hold a call's worst case (``input_tokens`` of the prompt, estimated, plus
        ``max_tokens``, priced as ``model``) against ``who``'s budgets; returns the id that
        settles it ("" when the store failed: the call goes ahead). Raises
        :class:`BudgetCutOff` when a budget has no room for it."""
        now = self._clock()
        priced = self._catalog.price([model], input_tokens, max_tokens)
        scopes = who.scopes() if who else [TOTAL]
        worst = input_tokens + max_tokens
        try:
            got = reserve(self._r, scopes, priced.usd_micros, worst, now, self._hold_s,
                          self._rate(who))
        except Exception as e:
            log.warning("could not reserve a %s call against its budgets, making it: %s",
                        model, e)
            return ""
        match got:
            case Reserved(id=rid):
                return rid
            case RateLimited() as limited:
                log.info("a %s call of agent %s refused: %d of %d tokens this minute", model,
                         limited.rate.agent, limited.used, limited.rate.per_minute)
                raise BudgetCutOff(rate_text(limited, worst, now))
            case Refused(scope=scope, period=period):
                found = [s for s in budgets.statuses(self._r, [scope], now)
                         if s.budget.period == period]
                if found and self._on_cap is not None:
                    self._on_cap(found[0])
                raise BudgetCutOff(_cutoff_reply(found, priced.usd_micros, worst))

    def release(self, reservation: str) -> None:
        """Give back the reservation of a call that failed (it reported no usage)."""
        if not reservation:
            return
        try:
            release(self._r, reservation, self._clock())
        except Exception as e:  # it lapses on its own
            log.warning("could not release a reservation (it lapses): %s", e)

    def charge(self, models: Sequence[str], input_tokens: int, output_tokens: int,
               who: Attribution | None, reservation: str = "", *, cache_read: int = 0,
               cache_write: int = 0, reasoning: int = 0,
               timeline_entry: Callable[[int], ModelCall] | None = None) -> int:
        """Count one call that answered, charged to ``who`` (None: ``total`` only), settling
        its ``reservation``, and return its cost (micro-dollars): ``models`` are the ids to
        price it by, the configured one first, then the one the provider reported; the tokens
        as ModelTurn reports them (``input_tokens`` with the cache's reads and writes,
        ``output_tokens`` with the reasoning), each priced at its rate. ``timeline_entry``
        (given the cost) is the call's entry in its run's timeline, written in the same round
        trip (:meth:`note_call`, folded in)."""
        if who is None:
            self._note_unattributed(models)
        now = self._clock()
        priced = self._catalog.price(models, input_tokens, output_tokens,
                                     cache_read=cache_read, cache_write=cache_write, when=now)
        metrics.count_usage(who.agent if who else "", priced.model, priced.usd_micros,
                            input=input_tokens, output=output_tokens, cache_read=cache_read,
                            cache_write=cache_write, reasoning=reasoning)
        try:
            with self._r.pipeline(transaction=False) as pipe:
                store.record(pipe, who.counted_in() if who else [TOTAL], input_tokens,
                             output_tokens, priced.usd_micros,
                             "" if priced.priced else priced.model, now, reservation,
                             cache_read=cache_read, cache_write=cache_write,
                             reasoning=reasoning)
                if timeline_entry is not None and who is not None and who.run_id:
                    timeline.record_call(self._r, who.run_id,
                                         timeline_entry(priced.usd_micros), via=pipe)
                results = pipe.execute(raise_on_error=False)
        except Exception as e:  # usage is bookkeeping: the call's answer still counts
            results = [e]
        if isinstance(results[0], Exception):
            log.warning("could not record the usage of a %s call (%d in, %d out): %s",
                        priced.model, input_tokens, output_tokens, results[0])
        if any(isinstance(x, Exception) for x in results[1:]):
            log.warning("could not add a call to run %s's timeline", who.run_id if who else "")
        return priced.usd_micros

    def note_call(self, who: Attribution | None, call: ModelCall) -> None:
        """Add ``call`` to its run's timeline (fermix_shared/stores/timeline.py), when it has
        a run; a failure is logged only."""
        if who is None or not who.run_id:
            return
        try:
            timeline.record_call(self._r, who.run_id, call)
        except Exception as e:  # the timeline is for people reading it: the call stands
            log.warning("could not add a call to run %s's timeline: %s", who.run_id, e)

    def _note_unattributed(self, models: Sequence[str]) -> None:
        with self._lock:
            if self._unattributed_logged:
                return
            self._unattributed_logged = True
        log.warning("a %s call ran with no usage attribution: counted in total only",
                    next((m for m in models if m), "model"))


def _cutoff_reply(found: list[BudgetStatus], worst_usd_micros: int, worst_tokens: int) -> str:
    """The reply of a turn stopped because its next call does not fit ``found``'s budget."""
    if not found:  # removed meanwhile: say what we know
        return "A budget has no room for the next step, so I stopped this request here."
    return budgets.cutoff_text(found[0], worst_usd_micros, worst_tokens)

