"""Scheduled jobs, the worker's half: ``ticker`` (beat's tick fires each due job once,
fleet-wide, and records each run's outcome). Jobs, cron and the store are
:mod:`fermix_shared.scheduling`.
"""
