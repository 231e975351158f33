"""Usage and budgets: what every model call cost, per agent, conversation, user and in total,
by UTC hour, day and month, and the limits set on them.

* :mod:`~fermix_shared.usage.prices`: the price catalogue (genai-prices) and the overrides;
* :mod:`~fermix_shared.usage.periods`: buckets and reset times;
* :mod:`~fermix_shared.usage.scopes`: scopes, and the attribution a model call is charged to;
* :mod:`~fermix_shared.usage.store`: counting a call (one Lua script) and reading totals;
* :mod:`~fermix_shared.usage.budgets`: limits, their state, and the warning and refusal texts.

The worker's meter (``fermix_worker/usage/meter.py``) records each call the provider router
makes; the turn checks budgets before its first model call (``fermix_worker/usage/budgets.py``).
"""

from fermix_shared.usage.budgets import Budget, BudgetStatus
from fermix_shared.usage.config import UsageConfig
from fermix_shared.usage.periods import PERIODS, Period
from fermix_shared.usage.prices import CallTokens, ModelPrice, PriceCatalog
from fermix_shared.usage.scopes import Attribution, attribution_for
from fermix_shared.usage.store import Totals

__all__ = [
    "PERIODS", "Attribution", "Budget", "BudgetStatus", "CallTokens", "ModelPrice",
    "Period", "PriceCatalog", "Totals", "UsageConfig", "attribution_for",
]
