"""The usage meter: prices a model call and counts it, once, against its attribution.

The provider router is the one way to a model (turns, subagents and skill runs, compaction,
the memory review, scheduled jobs); the process's routers are metered
(:class:`~fermix_worker.usage.metered.MeteredProvider`, built with the runtime's meter), which
charge each call that answered: the provider-reported tokens, priced by the catalog
(``[prices]`` over the built-in list prices), counted in the scopes of the attribution the
router was charged to (:func:`~fermix_worker.usage.metered.charged_to`) in one Lua script. A
call made with no attribution counts in ``total`` only (and is logged once). Recording never fails a call: a
store error is logged and the call's usage is lost. With usage off there is no meter, and a
router is used unwrapped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import redis

from fermix_shared.settings import Settings
from fermix_shared.usage import store
from fermix_shared.usage.prices import PriceCatalog
from fermix_shared.usage.scopes import TOTAL, Attribution

log = logging.getLogger(__name__)


class UsageMeter:
    """Prices and records calls for one process."""

    def __init__(self, r: redis.Redis, catalog: PriceCatalog,
                 clock: Callable[[], float] = time.time) -> None:
        self._r = r
        self._catalog = catalog
        self._clock = clock
        self._unattributed_logged = False
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, r: redis.Redis, settings: Settings) -> UsageMeter:
        return cls(r, PriceCatalog(settings.prices))

    def charge(self, models: Sequence[str], input_tokens: int, output_tokens: int,
               who: Attribution | None) -> None:
        """Count one call that answered, charged to ``who`` (None: ``total`` only): ``models``
        are the ids to price it by, the configured one first, then the one the provider
        reported."""
        if who is None:
            self._note_unattributed(models)
        priced = self._catalog.price(models, input_tokens, output_tokens)
        try:
            store.record(self._r, who.scopes() if who else [TOTAL], input_tokens,
                         output_tokens, priced.usd_micros,
                         "" if priced.priced else priced.model, self._clock())
        except Exception as e:  # usage is bookkeeping: the call's answer still counts
            log.warning("could not record the usage of a %s call (%d in, %d out): %s",
                        priced.model, input_tokens, output_tokens, e)

    def _note_unattributed(self, models: Sequence[str]) -> None:
        with self._lock:
            if self._unattributed_logged:
                return
            self._unattributed_logged = True
        log.warning("a %s call ran with no usage attribution: counted in total only",
                    next((m for m in models if m), "model"))
