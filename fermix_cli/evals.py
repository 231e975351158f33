"""``fermix eval SUITE`` and ``fermix eval --from-run RUN``: agents tested like code.

``fermix eval SUITE`` reads a suite file (TOML or YAML: fermix_shared/evals/suite.py) and runs
every case × agent × model (× ``--repeat N``) on the fleet through the gateway
(``POST /v1/evals/run``, each run on whichever worker takes it), ``--parallel`` at a time
(default 4). It prints each run as it ends (stderr), then the table (pass/fail or the pass
rate, median cost and latency) and every failed expectation; ``--json FILE`` and ``--junit
FILE`` write the report and JUnit XML. Exit 0 when every cell's pass rate is at least
``--min-pass-rate`` (default 1: every run passes), 1 otherwise, 2 for a suite that cannot be
read (the sentence names the file, case and key). ``--json -`` prints the report (one JSON
document) on stdout instead of the table; on a terminal a bar on stderr counts the runs.

``fermix eval --from-run RUN`` prints the recorded run as a case to add to a suite (TOML, or
YAML with ``--format yaml``): its history and message, its agent, its reply as the reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from fermix_cli import output
from fermix_cli.client import (
    ClientError,
    GatewayRefused,
    gateway_json,
    positive_int,
    refusals_as_exit_1,
)
from fermix_shared.evals import report
from fermix_shared.evals.suite import Suite, SuiteError, Target, load
from fermix_shared.settings import get_settings

# What the CLI waits for one run: a little longer than the gateway waits for its worker.
RUN_TIMEOUT_S = 610
DEFAULT_PARALLEL = 4


def _rate(text: str) -> float:
    try:
        x = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        x = -1
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pass rate (0 to 1, or 0% to 100%)")
    return x


def _one(suite: Suite, target: Target) -> dict[str, Any]:
    payload = {"suite": suite.name, "case": target.case.model_dump(mode="json"),
               "agent": target.agent, "model": target.model, "grader": suite.grader,
               "repeat": target.repeat}
    try:
        return gateway_json(get_settings(), "POST", "/v1/evals/run", "eval run",
                            payload=payload, timeout=RUN_TIMEOUT_S)
    except GatewayRefused as e:
        if e.status in (401, 403):
            raise
        return report.not_run(target, suite.name, f"not run: {e.reason} (HTTP {e.status})")
    except ClientError as e:
        return report.not_run(target, suite.name, f"not run: {e}")


def run_suite(suite: Suite, repeat: int, parallel: int, quiet: bool = False
              ) -> list[dict[str, Any]]:
    """Every run of the suite, ``parallel`` at a time, in the order asked for. Each run's
    line goes to stderr as it ends (not ``quiet``); on a terminal, a bar counts them."""
    targets = suite.targets(repeat)

    with output.steps(f"eval {suite.name}: {len(targets)} runs, {min(parallel, len(targets))} "
                      "at a time", total=len(targets)) as steps:
        def one(target: Target) -> dict[str, Any]:
            run = _one(suite, target)
            if not quiet:
                verdict = "PASS" if run["passed"] else (
                    "NOT RUN" if run.get("status") == "not run" else "FAIL")
                steps.line(f"{verdict:<7} {target.case.name} [{target.label}] "
                           f"#{target.repeat}  {run['latencyS']:.2f} s")
            steps.advance()
            return run

        with ThreadPoolExecutor(max_workers=min(parallel, len(targets))) as pool:
            return list(pool.map(one, targets))


def _write(path: str, text: str) -> None:
    Path(path).write_text(text, encoding="utf-8")


def _eval(a: argparse.Namespace) -> int:
    if a.from_run:
        if a.suite is not None:
            print("fermix: give a SUITE or --from-run RUN, not both", file=sys.stderr)
            return 2
        return _from_run(a)
    if a.suite is None:
        print("fermix: eval needs a SUITE file (or --from-run RUN)", file=sys.stderr)
        return 2
    suite = load(Path(a.suite))
    if a.case:
        unknown = [n for n in a.case if n not in {c.name for c in suite.cases}]
        if unknown:
            raise SuiteError(f"{a.suite} has no case named {unknown[0]!r}")
        suite = Suite(suite.name, [c for c in suite.cases if c.name in a.case], suite.agents,
                      suite.models, suite.grader)
    runs = run_suite(suite, a.repeat, a.parallel, quiet=a.quiet)
    as_json = report.report_json(suite, runs, a.repeat, a.min_pass_rate)
    if a.json == "-":  # the report is the output
        output.print_json(as_json, ensure_ascii=False)
    else:
        _print_table(suite, runs, a.min_pass_rate)
        if a.json:
            _write(a.json, json.dumps(as_json, indent=2, ensure_ascii=False) + "\n")
    if a.junit:
        _write(a.junit, report.junit_xml(suite, runs))
    return 1 if report.failing(report.cells(runs), a.min_pass_rate) else 0


def _verdict(cell: report.Cell | None) -> output.Cell:
    """A cell on a terminal: its verdict coloured (all passed green, some yellow, none red;
    not run yellow), its median cost and latency beside it."""
    if cell is None:
        return "—"
    said = report.verdict(cell)
    style = ("yellow" if "not run" in said.lower() else "green" if cell.passed == len(cell.runs)
             else "red" if cell.passed == 0 else "yellow")
    return output.Text.assemble((said, f"bold {style}"), f"  {report.cost_and_latency(cell)}")


def _print_table(suite: Suite, runs: list[dict[str, Any]], min_rate: float) -> None:
    """The report: a table on a terminal, the plain one on a pipe (as always)."""
    console = output.terminal()
    if console is None:
        print(report.table(suite, runs, min_rate))
        return
    columns, rows = report.grid(runs)
    output.table(console, ["CASE", *columns], [[name, *map(_verdict, row)] for name, row in rows],
                 title=report.heading(suite, runs))
    console.print(output.Text("\n".join(report.closing(runs, min_rate)).lstrip("\n")))


def _from_run(a: argparse.Namespace) -> int:
    body = gateway_json(get_settings(), "GET", f"/v1/runs/{a.from_run}/case", "case request")
    case = body["case"]
    if a.format == "yaml":
        text = yaml.safe_dump({"cases": [case]}, allow_unicode=True, sort_keys=False)
    else:
        text = tomli_w.dumps({"case": [case]}, multiline_strings=True)
    if a.out:
        _write(a.out, text)
        print(f"Wrote the case {case['name']!r} to {a.out}.", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``eval`` on the ``fermix`` parser."""
    ev = sub.add_parser("eval", help="run an eval suite on the fleet; or make a run a case")
    ev.add_argument("suite", metavar="SUITE", nargs="?", help="a .toml or .yaml suite file")
    ev.add_argument("--from-run", metavar="RUN", help="print the recorded run RUN as a case")
    ev.add_argument("--format", choices=("toml", "yaml"), default="toml",
                    help="--from-run's format (default toml)")
    ev.add_argument("--out", metavar="FILE", help="--from-run writes the case to FILE")
    ev.add_argument("--repeat", type=positive_int, default=1,
                    help="run each case N times and report pass rates")
    ev.add_argument("--parallel", type=positive_int, default=DEFAULT_PARALLEL,
                    help=f"runs in flight at once (default {DEFAULT_PARALLEL})")
    ev.add_argument("--min-pass-rate", type=_rate, default=1.0,
                    help="a cell passes at this rate (default 1: every run)")
    ev.add_argument("--case", action="append", metavar="NAME",
                    help="run only this case (repeatable)")
    ev.add_argument("--json", metavar="FILE",
                    help="write the report as JSON ('-': print it instead of the table)")
    ev.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    ev.add_argument("--quiet", action="store_true", help="no line per run while it runs")
    ev.set_defaults(func=refusals_as_exit_1(401, 403, 404, 422, 504)(_eval))
