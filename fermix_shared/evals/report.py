"""A suite's runs folded into what ``fermix eval`` prints and writes: the table (case × agent
and model: pass or fail, or the pass rate over ``--repeat`` runs, the median cost and latency),
the JSON report, and JUnit XML (one ``testcase`` per run, a ``failure`` per failed run with
its sentences, an ``error`` for a run that could not be made), which CI systems read.

A run is the JSON ``POST /v1/evals/run`` answers (fermix_worker/evals/run.py), or, for a run
the gateway refused or never answered, :func:`not_run`'s stand-in.
"""

from __future__ import annotations

import statistics
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from fermix_shared.evals.suite import Suite, Target


def not_run(target: Target, suite: str, reason: str) -> dict[str, Any]:
    """A run that could not be made (the gateway's refusal, no worker), in a run's shape."""
    return {"suite": suite, "case": target.case.name, "agent": target.agent,
            "model": target.model, "repeat": target.repeat, "passed": False,
            "status": "not run", "failures": [reason], "reply": "", "toolCalls": [],
            "steps": 0, "usd": 0.0, "latencyS": 0.0}


def label(run: dict[str, Any]) -> str:
    return run["agent"] if run.get("model") is None else f"{run['agent']} @ {run['model']}"


@dataclass
class Cell:
    """One case on one agent and model: its runs."""

    case: str
    label: str
    runs: list[dict[str, Any]]

    @property
    def passed(self) -> int:
        return sum(1 for r in self.runs if r["passed"])

    @property
    def rate(self) -> float:
        return self.passed / len(self.runs) if self.runs else 0.0

    @property
    def usd(self) -> float:
        return float(statistics.median(r["usd"] for r in self.runs))

    @property
    def latency_s(self) -> float:
        return float(statistics.median(r["latencyS"] for r in self.runs))

    def as_json(self) -> dict[str, Any]:
        return {"case": self.case, "label": self.label, "runs": len(self.runs),
                "passed": self.passed, "passRate": round(self.rate, 4),
                "medianUsd": round(self.usd, 6), "medianLatencyS": round(self.latency_s, 3)}


def cells(runs: list[dict[str, Any]]) -> list[Cell]:
    """The runs by case and column, in the order they were asked for."""
    out: dict[tuple[str, str], Cell] = {}
    for run in runs:
        key = (run["case"], label(run))
        out.setdefault(key, Cell(key[0], key[1], [])).runs.append(run)
    return list(out.values())


def failing(found: list[Cell], min_rate: float = 1.0) -> list[Cell]:
    """The cells whose pass rate is under ``min_rate`` (every run must pass, by default)."""
    return [c for c in found if c.rate < min_rate]


def verdict(cell: Cell) -> str:
    """``PASS`` or ``FAIL`` for one run, ``2/3 67%`` over repeats, ``NOT RUN`` when none ran."""
    n = len(cell.runs)
    if all(r.get("status") == "not run" for r in cell.runs):
        return "NOT RUN" if n == 1 else f"0/{n} not run"
    return ("PASS" if cell.passed == n else "FAIL") if n == 1 else \
        f"{cell.passed}/{n} {cell.rate:.0%}"


def cost_and_latency(cell: Cell) -> str:
    return f"${cell.usd:.4f}  {cell.latency_s:.2f} s"


def grid(runs: list[dict[str, Any]]) -> tuple[list[str], list[tuple[str, list[Cell | None]]]]:
    """The table's columns (agent and model) and its rows: each case's cells, ``None`` where
    the case did not run on a column."""
    found = cells(runs)
    columns = list(dict.fromkeys(c.label for c in found))
    by_key = {(c.case, c.label): c for c in found}
    names = list(dict.fromkeys(c.case for c in found))
    return columns, [(name, [by_key.get((name, col)) for col in columns]) for name in names]


def heading(suite: Suite, runs: list[dict[str, Any]]) -> str:
    columns, rows = grid(runs)
    return (f"Suite {suite.name}: {len(rows)} cases × {len(columns)} "
            f"{'column' if len(columns) == 1 else 'columns'}, {len(runs)} runs")


def closing(runs: list[dict[str, Any]], min_rate: float = 1.0) -> list[str]:
    """What follows the table: the failed runs with their sentences, and the verdict line."""
    lines = []
    failed_runs = [r for r in runs if not r["passed"]]
    if failed_runs:
        lines += ["", "Failures:"]
        for r in failed_runs:
            lines.append(f"  {r['case']} [{label(r)}] #{r['repeat']}"
                         + (f" ({r['runId']})" if r.get("runId") else ""))
            lines += [f"    - {f}" for f in r["failures"]]
    found = cells(runs)
    bad = failing(found, min_rate)
    passed = sum(1 for r in runs if r["passed"])
    lines.append("")
    lines.append(f"{passed} of {len(runs)} runs passed; "
                 + (f"{len(bad)} of {len(found)} cells below the pass rate "
                    f"{min_rate:.0%}." if bad else f"every cell at or above {min_rate:.0%}."))
    return lines


def table(suite: Suite, runs: list[dict[str, Any]], min_rate: float = 1.0) -> str:
    """The table, the failed runs' sentences, and a closing line."""
    columns, grid_rows = grid(runs)
    rows = [["case", *columns]]
    rows += [[name, *(f"{verdict(c)}  {cost_and_latency(c)}" if c else "—" for c in row)]
             for name, row in grid_rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns) + 1)]
    lines = [heading(suite, runs)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines + closing(runs, min_rate))


def report_json(suite: Suite, runs: list[dict[str, Any]], repeat: int,
                min_rate: float = 1.0) -> dict[str, Any]:
    """The whole result: the cells, every run, and whether the suite passed."""
    found = cells(runs)
    return {"suite": suite.name, "repeat": repeat, "minPassRate": min_rate,
            "passed": not failing(found, min_rate),
            "cells": [c.as_json() for c in found], "runs": runs}


def junit_xml(suite: Suite, runs: list[dict[str, Any]]) -> str:
    """JUnit XML: a ``testsuite`` for the suite, a ``testcase`` per run."""
    failures = sum(1 for r in runs if not r["passed"] and r.get("status") != "not run")
    errors = sum(1 for r in runs if r.get("status") == "not run")
    total_s = sum(r["latencyS"] for r in runs)
    root = ET.Element("testsuites", name="fermix eval", tests=str(len(runs)),
                      failures=str(failures), errors=str(errors), time=f"{total_s:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite.name, tests=str(len(runs)),
                       failures=str(failures), errors=str(errors), skipped="0",
                       time=f"{total_s:.3f}")
    for r in runs:
        name = f"{r['case']} [{label(r)}]" + (f" #{r['repeat']}" if r["repeat"] > 1 or any(
            o["repeat"] > 1 for o in runs) else "")
        tc = ET.SubElement(ts, "testcase", classname=f"{suite.name}.{r['case']}", name=name,
                           time=f"{r['latencyS']:.3f}")
        props = ET.SubElement(tc, "properties")
        for key in ("runId", "agent", "model", "steps", "usd"):
            if r.get(key) is not None:
                ET.SubElement(props, "property", name=key, value=str(r[key]))
        if r.get("status") == "not run":
            el = ET.SubElement(tc, "error", message=r["failures"][0], type="not run")
            el.text = "\n".join(r["failures"])
        elif not r["passed"]:
            el = ET.SubElement(tc, "failure", message=r["failures"][0], type="expectation")
            el.text = "\n".join(r["failures"])
        if r.get("reply"):
            ET.SubElement(tc, "system-out").text = r["reply"]
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
