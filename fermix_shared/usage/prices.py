"""The model price catalog: what a call costs, as the provider bills it.

Prices come from a maintained catalogue, `genai-prices <https://github.com/pydantic/genai-prices>`_
(its data bundled with the package, so pricing never touches the network: its updater is
never started), for every model it knows: input, cached input read and written, output
(reasoning tokens are output, as both providers bill them), and long-context tiers (Claude's
input past 200k tokens). The operator's ``[prices]`` override it, model by model, and add the
models it does not know (USD per million tokens; ``cache_read``/``cache_write`` default to
``input``)::

    [prices."gpt-4.1-mini"]          # fermix.toml
    input = 0.40
    output = 1.60
    cache_read = 0.10

    FERMIX_PRICES='{"my-vllm-model": {"input": 0, "output": 0}}'

An override is looked up as given, then without a date or ``-latest`` suffix
(``claude-sonnet-4-5-20250929``, ``gpt-4o-2024-08-06``); the catalogue matches snapshots
itself. A model found in neither is *unpriced*: its calls count their tokens and $0, usage
names it as an unknown model, and each process logs a warning once per model.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Protocol

import genai_prices
from pydantic import BaseModel, ConfigDict, Field, field_validator

log = logging.getLogger(__name__)


class ModelPrice(BaseModel):
    """USD per million tokens (``[prices."model-id"]``): input, output, and cached input
    read and written (the input price when not given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)

    @field_validator("input", "output", "cache_read", "cache_write")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("a price is a finite number of USD per million tokens")
        return v


@dataclass(frozen=True)
class CallTokens:
    """A call's tokens as :class:`~fermix_worker.providers.base.ModelTurn` reports them:
    ``input`` is every input token, ``cache_read`` and ``cache_write`` the part of them read
    from and written to the prompt cache; ``output`` includes ``reasoning``."""

    input: int
    output: int
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0

    @property
    def uncached(self) -> int:
        """The input tokens at the full input rate."""
        return max(0, self.input - self.cache_read - self.cache_write)


# A snapshot or alias of a catalog model: ``-20250929``, ``-2024-08-06``, ``-latest``.
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def cost_micros(price: ModelPrice, input_tokens: int, output_tokens: int,
                cache_read: int = 0, cache_write: int = 0) -> int:
    """The call's cost in micro-dollars (USD per million tokens is micro-dollars per token),
    rounded to the nearest one per call; ``input_tokens`` includes the cached ones."""
    t = CallTokens(input_tokens, output_tokens, cache_read, cache_write)
    read = price.input if price.cache_read is None else price.cache_read
    write = price.input if price.cache_write is None else price.cache_write
    return round(t.uncached * price.input + t.cache_read * read + t.cache_write * write
                 + t.output * price.output)


def _micros(usd: Decimal) -> int:
    return int((usd * 1_000_000).to_integral_value(ROUND_HALF_EVEN))


class Catalogue(Protocol):
    """Prices the calls of the models it knows."""

    def price(self, model: str, tokens: CallTokens, when: datetime) -> tuple[str, int] | None:
        """``(its id for the model, micro-dollars)``, or None for a model it does not know."""
        ...


class GenaiPrices:
    """The genai-prices catalogue (bundled data; the provider found from the model id).

    Its lookups of known models are cached by the library; unknown ids are remembered here,
    so a call of an unpriced model does not scan the catalogue again."""

    def __init__(self) -> None:
        self._unknown: set[str] = set()

    def price(self, model: str, tokens: CallTokens, when: datetime) -> tuple[str, int] | None:
        if model in self._unknown:
            return None
        usage = genai_prices.Usage(
            input_tokens=max(tokens.input, tokens.cache_read + tokens.cache_write),
            cache_read_tokens=tokens.cache_read, cache_write_tokens=tokens.cache_write,
            output_tokens=tokens.output)
        try:
            got = genai_prices.calc_price(usage, model, genai_request_timestamp=when)
        except LookupError:
            self._unknown.add(model)
            return None
        return got.model.id, _micros(got.total_price)


GENAI_PRICES = GenaiPrices()


@dataclass(frozen=True)
class PricedCall:
    """A call's cost: the model id it was priced as (or the unpriced one) and micro-dollars;
    ``source`` is where the price came from (``override``, ``catalogue``; "" unpriced)."""

    model: str
    usd_micros: int
    priced: bool
    source: str = ""


class PriceCatalog:
    """The configured overrides over the maintained catalogue (None: overrides only)."""

    def __init__(self, overrides: Mapping[str, ModelPrice] | None = None,
                 catalogue: Catalogue | None = GENAI_PRICES) -> None:
        self._prices = dict(overrides or {})
        self._catalogue = catalogue
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def lookup(self, model: str) -> tuple[str, ModelPrice] | None:
        """``(override id, price)`` for ``model``, or None when no override prices it."""
        for name in (model, _SNAPSHOT.sub("", model)):
            if name in self._prices:
                return name, self._prices[name]
        return None

    def price(self, models: Sequence[str], input_tokens: int, output_tokens: int, *,
              cache_read: int = 0, cache_write: int = 0, when: float | None = None
              ) -> PricedCall:
        """Price a call (``input_tokens`` with the cached ones, of which ``cache_read`` and
        ``cache_write``) made at ``when`` (unix time; now) by ``models``, the configured id
        then the one the provider reported: an override for any of them first, then the
        catalogue's price for the first it knows; unpriced (counted as $0, warned once)
        when none is known."""
        tokens = CallTokens(input_tokens, output_tokens, cache_read, cache_write)
        named = [m for m in models if m]
        for model in named:
            if (found := self.lookup(model)) is not None:
                name, price = found
                return PricedCall(name, cost_micros(price, input_tokens, output_tokens,
                                                    cache_read, cache_write), True, "override")
        at = datetime.fromtimestamp(when, UTC) if when is not None else datetime.now(UTC)
        for model in named:
            if (got := self._catalogue_price(model, tokens, at)) is not None:
                return PricedCall(got[0], got[1], True, "catalogue")
        name = named[0] if named else "unknown"
        self._warn_once(name)
        return PricedCall(name, 0, False)

    def _catalogue_price(self, model: str, tokens: CallTokens, at: datetime
                         ) -> tuple[str, int] | None:
        if self._catalogue is None:
            return None
        try:
            return self._catalogue.price(model, tokens, at)
        except Exception as e:  # a catalogue bug must not fail the call it prices
            log.warning("the price catalogue failed on model %r: %s", model, e)
            return None

    def _warn_once(self, model: str) -> None:
        with self._lock:
            if model in self._warned:
                return
            self._warned.add(model)
        log.warning("no price for model %r: its calls count their tokens and $0 (usage shows "
                    "it as an unknown model); set [prices.%r] input/output (USD per million "
                    "tokens)", model, model)
