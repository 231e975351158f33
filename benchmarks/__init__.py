"""Benchmarks and the chaos run. A package so tests can import them (``benchmarks.chaos``); each
module also runs as a script (``.venv/bin/python benchmarks/chaos.py``)."""
