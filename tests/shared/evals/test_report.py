"""The table, the JSON report and JUnit XML made from a suite's runs."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from fermix_shared.evals import report
from fermix_shared.evals.suite import parse


def _run(case: str, passed: bool, repeat: int = 1, model: str | None = None,
         usd: float = 0.001, latency: float = 0.5) -> dict[str, Any]:
    return {"case": case, "agent": "default", "model": model, "repeat": repeat,
            "passed": passed, "failures": [] if passed else ["reply does not contain '42'"],
            "status": "ok", "reply": "r", "usd": usd, "latencyS": latency,
            "runId": f"run_{case}_{repeat}", "steps": 1}


SUITE = parse({"suite": {"name": "s"}, "cases": [{"name": "a", "message": "m"},
                                                 {"name": "b", "message": "m"}]}, "t")


def test_repeats_show_a_pass_rate_and_the_median() -> None:
    runs = [_run("a", True, 1, latency=1), _run("a", False, 2, latency=3),
            _run("a", True, 3, latency=2), _run("b", True)]
    text = report.table(SUITE, runs, min_rate=0.6)
    assert "a     2/3 67%  $0.0010  2.00 s" in text
    assert "  a [default] #2 (run_a_2)\n    - reply does not contain '42'" in text
    assert text.endswith("3 of 4 runs passed; every cell at or above 60%.")
    body = report.report_json(SUITE, runs, 3, 0.6)
    assert body["passed"] is True and body["cells"][0]["passRate"] == 0.6667
    assert report.report_json(SUITE, runs, 3)["passed"] is False


def test_junit_has_a_testcase_per_run_a_failure_or_an_error() -> None:
    refused = report.not_run(SUITE.targets()[1], "s", "not run: no agent is named 'x'")
    xml = report.junit_xml(SUITE, [_run("a", False), refused])
    ts = ET.fromstring(xml).find("testsuite")
    assert ts is not None
    assert (ts.get("tests"), ts.get("failures"), ts.get("errors")) == ("2", "1", "1")
    a, b = ts.findall("testcase")
    assert a.get("name") == "a [default]" and a.get("classname") == "s.a"
    failure = a.find("failure")
    assert failure is not None and failure.get("message") == "reply does not contain '42'"
    error = b.find("error")
    assert error is not None and error.get("message") == "not run: no agent is named 'x'"
    assert "NOT RUN" in report.table(SUITE, [refused])
