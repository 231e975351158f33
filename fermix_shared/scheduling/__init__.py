"""Scheduled jobs: cron in IANA time zones, the job record, its Redis store and the CLI.

Shared by the CLI (which talks to Redis directly), the agent tools and the worker's
scheduler tick (``fermix_worker/scheduler.py``).
"""
