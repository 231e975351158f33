"""The model price catalog: list prices in USD per million tokens, input and output.

The built-in prices are the providers' published list prices as of writing (2025) for the
default models and the common ones; they do not know about cached-input, batch or
long-context tiers and they go stale, so every one is overridable, and a model they do not
know is added the same way::

    [prices."gpt-4.1-mini"]          # fermix.toml
    input = 0.40
    output = 1.60

    FERMIX_PRICES='{"my-vllm-model": {"input": 0, "output": 0}}'

A model id is looked up as given, then without a date or ``-latest`` suffix
(``claude-sonnet-4-5-20250929``, ``gpt-4o-2024-08-06``). A model found nowhere is *unpriced*:
its calls count their tokens and $0, usage shows them as unpriced, and each process logs a
warning once per model.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

log = logging.getLogger(__name__)


class ModelPrice(BaseModel):
    """USD per million tokens (``[prices."model-id"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)

    @field_validator("input", "output")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("a price is a finite number of USD per million tokens")
        return v


def _p(input_usd: float, output_usd: float) -> ModelPrice:
    return ModelPrice(input=input_usd, output=output_usd)


# List prices, USD per million tokens, as published when this was written (2025).
BUILTIN_PRICES: dict[str, ModelPrice] = {
    # OpenAI
    "gpt-5": _p(1.25, 10.00),
    "gpt-5-mini": _p(0.25, 2.00),
    "gpt-5-nano": _p(0.05, 0.40),
    "gpt-4.1": _p(2.00, 8.00),
    "gpt-4.1-mini": _p(0.40, 1.60),
    "gpt-4.1-nano": _p(0.10, 0.40),
    "gpt-4o": _p(2.50, 10.00),
    "gpt-4o-mini": _p(0.15, 0.60),
    "o1": _p(15.00, 60.00),
    "o3": _p(2.00, 8.00),
    "o3-mini": _p(1.10, 4.40),
    "o4-mini": _p(1.10, 4.40),
    # Anthropic
    "claude-opus-4-1": _p(15.00, 75.00),
    "claude-opus-4-0": _p(15.00, 75.00),
    "claude-opus-4": _p(15.00, 75.00),
    "claude-sonnet-4-5": _p(3.00, 15.00),
    "claude-sonnet-4-0": _p(3.00, 15.00),
    "claude-sonnet-4": _p(3.00, 15.00),
    "claude-3-7-sonnet": _p(3.00, 15.00),
    "claude-haiku-4-5": _p(1.00, 5.00),
    "claude-3-5-haiku": _p(0.80, 4.00),
}

# A snapshot or alias of a catalog model: ``-20250929``, ``-2024-08-06``, ``-latest``.
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def cost_micros(price: ModelPrice, input_tokens: int, output_tokens: int) -> int:
    """The call's cost in micro-dollars (USD per million tokens is micro-dollars per token),
    rounded to the nearest one per call."""
    return round(input_tokens * price.input + output_tokens * price.output)


@dataclass(frozen=True)
class PricedCall:
    """A call's cost: the model id it was priced as (or the unpriced one) and micro-dollars."""

    model: str
    usd_micros: int
    priced: bool


class PriceCatalog:
    """The built-in prices with the configured overrides on top."""

    def __init__(self, overrides: Mapping[str, ModelPrice] | None = None,
                 builtin: Mapping[str, ModelPrice] = BUILTIN_PRICES) -> None:
        self._prices = {**builtin, **(overrides or {})}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def lookup(self, model: str) -> tuple[str, ModelPrice] | None:
        """``(catalog id, price)`` for ``model``, or None when it is unpriced."""
        for name in (model, _SNAPSHOT.sub("", model)):
            if name in self._prices:
                return name, self._prices[name]
        return None

    def price(self, models: Sequence[str], input_tokens: int, output_tokens: int) -> PricedCall:
        """Price a call by the first of ``models`` (the configured id, then the one the
        provider reported) that has a price; unpriced (counted as $0, warned once) when none
        has."""
        for model in models:
            if model and (found := self.lookup(model)) is not None:
                name, price = found
                return PricedCall(name, cost_micros(price, input_tokens, output_tokens), True)
        name = next((m for m in models if m), "unknown")
        self._warn_once(name)
        return PricedCall(name, 0, False)

    def _warn_once(self, model: str) -> None:
        with self._lock:
            if model in self._warned:
                return
            self._warned.add(model)
        log.warning("no price for model %r: its calls count their tokens and $0 (shown as "
                    "unpriced); set [prices.%r] input/output (USD per million tokens)",
                    model, model)
