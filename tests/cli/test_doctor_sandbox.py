"""The ``sandbox`` lines of ``fermix doctor``: from the reports the live workers wrote (pure)."""

from __future__ import annotations

from fermix_cli.doctor.sandbox_checks import grouped
from fermix_shared.stores.sandbox import SandboxReport

CGROUPS = "memory: cgroup v1 (/sys/fs/cgroup/memory); pids: cgroup v1 (/sys/fs/cgroup/pids)"
PER_PROCESS = "memory: per process only; pids: per process only"


def report(state: str, limits: str = CGROUPS, run_command: bool = True) -> SandboxReport:
    detail = {"bwrap": "bubblewrap (/usr/bin/bwrap): no network",
              "none": "unsandboxed by FERMIX_SANDBOX=none: the host's files",
              "unavailable": "run_command is not offered: bwrap cannot create its namespaces"}
    return SandboxReport(mode="none" if state == "none" else "auto", state=state,  # type: ignore[arg-type]
                         detail=detail[state], limits=limits, run_command=run_command)


def test_bwrap_with_per_command_limits_is_ok_and_workers_alike_share_a_line() -> None:
    (line,) = grouped({"w1@a": 100.0, "w2@b": 100.0}, {"w1@a": report("bwrap"),
                                                       "w2@b": report("bwrap")}, now=101.0)
    assert (line.level, line.fix) == ("ok", None)
    assert line.message.startswith("w1@a, w2@b: bubblewrap (/usr/bin/bwrap)")


def test_what_is_not_contained_is_a_warning_with_its_fix() -> None:
    lines = grouped({"a": 1.0, "b": 1.0, "c": 1.0, "stale": -100.0},
                    {"a": report("unavailable", run_command=False), "b": report("none"),
                     "c": report("bwrap", PER_PROCESS), "stale": report("none")}, now=2.0)
    by = {line.message[0]: line for line in lines}
    assert sorted(by) == ["a", "b", "c"]  # a worker silent for over a minute is not shown
    assert all(line.level == "warn" for line in lines)
    assert "FERMIX_SANDBOX=none" in (by["a"].fix or "")
    assert "FERMIX_SANDBOX=auto" in (by["b"].fix or "")
    assert "per process only" in by["c"].message and "cgroup" in (by["c"].fix or "")


def test_no_workspace_means_no_command_runs() -> None:
    (line,) = grouped({"a": 1.0}, {"a": report("bwrap", PER_PROCESS, run_command=False)}, 1.0)
    assert line.level == "ok" and "no workspace is configured" in line.message
