"""Usage and budgets, the worker's half: ``meter`` (every model call counted and priced),
``metered`` (the provider router wrapped to charge each call) and ``budgets`` (the warning
when a budget runs low). Prices, periods and totals are :mod:`fermix_shared.usage`.
"""
