"""Scheduled jobs: cron in IANA time zones, the job record and its Redis store.

Shared by the CLI (``fermix_cli/schedule.py``, which talks to Redis directly), the agent
tools and the worker's scheduler tick (``fermix_worker/scheduling/ticker.py``).
"""
