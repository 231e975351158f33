"""``fermix doctor``: checks this deployment and explains each finding in one line, ``ok``,
``warn`` or ``fail``, with the fix.

In order: the configuration parses (``config``); with Sentinel, the sentinels answer and name
a master with replicas (``redis.sentinel``); under a durability wait, the master's connected
replicas and what ``FERMIX_REDIS_WAIT_REPLICAS`` makes of them (``redis.replicas``);
Redis answers, its version, persistence and eviction policy (``redis*``); workers and beat are alive and the hosts' clocks agree
(``workers``, ``beat``, ``clock``); how each live worker runs commands (``sandbox``:
bubblewrap, unavailable, or none, and what bounds a command); every provider route has its key and, with ``--live``,
answers a 1-token call (``provider*``); Telegram and Slack accept their bot tokens
(``telegram*``, ``slack*``). Secrets are only ever said to be present or not.

Exit code: 0 when every line is ok or warn, 2 when any line is fail; ``--strict`` exits 1
when the worst line is a warn. On a terminal the lines are a table with coloured levels, and
stderr says which check runs meanwhile (the ``--live`` calls take seconds).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence

from fermix_cli import output
from fermix_cli.doctor.check import Check, as_json, exit_code, render, summary

__all__ = ["Check", "add_parser", "run_checks"]


def _quiet(what: str) -> None:
    pass


def run_checks(live: bool = False, step: Callable[[str], None] = _quiet) -> list[Check]:
    """Every check, in the order printed; ``step`` is told what is checked next. Stops after
    ``config`` when no settings load."""
    # Here, not at the top: every `fermix` command builds this parser, few need the SDKs.
    from fermix_cli.doctor.channels import slack_checks, telegram_checks
    from fermix_cli.doctor.config import load_settings
    from fermix_cli.doctor.providers import provider_checks
    from fermix_cli.doctor.redis_checks import redis_checks
    from fermix_cli.doctor.sandbox_checks import sandbox_checks
    from fermix_cli.doctor.sentinel_checks import replica_checks, sentinel_checks

    step("doctor: reading the configuration")
    settings, config = load_settings()
    checks = [config]
    if settings is None:
        return checks
    step("doctor: asking Redis (and its sentinels and replicas)")
    checks += sentinel_checks(settings)
    checks += replica_checks(settings)
    checks += redis_checks(settings)
    step("doctor: reading the workers' sandboxes")
    checks += sandbox_checks(settings)
    step("doctor: checking the provider routes")
    checks += provider_checks(settings, os.environ, live, step)
    step("doctor: asking Telegram and Slack")
    checks += telegram_checks(settings)
    checks += slack_checks(settings)
    return checks


def _table(console: output.Console, checks: Sequence[Check]) -> None:
    rows: list[list[output.Cell]] = []
    for c in checks:
        rows.append([output.state(c.level), c.name, c.message])
        if c.fix:
            rows.append(["", "", output.Text(f"fix: {c.fix}", style="cyan")])
    output.table(console, ("LEVEL", "CHECK", "FINDING"), rows)
    console.print(output.Text(summary(checks)))


def _doctor(a: argparse.Namespace) -> int:
    with output.steps("doctor: starting") as steps:
        checks = run_checks(a.live, steps.doing)
    if a.json:
        output.print_json(as_json(checks, a.strict))
    elif (console := output.terminal()) is not None:
        _table(console, checks)
    else:
        print(render(checks))
    return exit_code(checks, a.strict)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor`` on the ``fermix`` parser."""
    d = sub.add_parser(
        "doctor", help="check configuration, Redis, workers, beat, clocks, providers, channels",
        description="Check this deployment; each line says ok, warn or fail and how to fix it.",
        epilog="Exit code: 0 when every line is ok or warn, 2 when any line is fail, 1 with "
               "--strict when the worst line is warn. Secrets are never printed, only whether "
               "they are present.")
    d.add_argument("--live", action="store_true",
                   help="also make one 1-token model call per distinct provider route")
    d.add_argument("--strict", action="store_true", help="exit 1 when any line is warn")
    d.add_argument("--json", action="store_true", help="print the checks as JSON")
    d.set_defaults(func=_doctor)
