"""``fermix doctor``: how the live workers run ``run_command`` (the ``sandbox`` lines).

Each worker probes its own host at start and writes what it found into Redis
(fermix_shared/stores/sandbox.py); the doctor may run elsewhere, so it reads those reports
instead of probing here. Workers that report the same thing share one line.

Levels: ``ok`` when commands run in bubblewrap with memory and processes bound per command
(or no workspace is configured, so no command runs); ``warn`` when commands run unsandboxed
(``FERMIX_SANDBOX=none``), when bwrap cannot run so ``run_command`` is not offered, or when a
command's memory or processes are bound per process only (no usable cgroup).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import redis

from fermix_cli.doctor.check import Check, clip
from fermix_cli.doctor.redis_checks import connect
from fermix_shared import keys
from fermix_shared.settings import Settings
from fermix_shared.stores.sandbox import SandboxReport, reports

_FIX_BWRAP = ("install bubblewrap and let it create namespaces (in a container: allow user "
              "namespaces, or run the worker where they are allowed), or set "
              "FERMIX_SANDBOX=none to run commands unsandboxed")
_FIX_LIMITS = ("give the worker a writable cgroup (cgroup v2: FERMIX_COMMAND_CGROUP, a "
               "directory whose cgroup.subtree_control lists memory and pids; or the v1 memory "
               "and pids hierarchies)")


def check_sandbox(nodes: list[str], report: SandboxReport) -> Check:
    """One line for the workers ``nodes`` that all reported ``report``."""
    who = ", ".join(sorted(nodes)[:6]) + (", ..." if len(nodes) > 6 else "")
    if not report.run_command and report.state != "unavailable":
        return Check("sandbox", "ok", f"{who}: no workspace is configured, so no command runs.")
    partial = "per process only" in report.limits
    match report.state:
        case "unavailable":
            return Check("sandbox", "warn", clip(f"{who}: {report.detail}", 400), _FIX_BWRAP)
        case "none":
            return Check("sandbox", "warn", clip(f"{who}: {report.detail}; limits: "
                                                 f"{report.limits}", 400),
                         "install bubblewrap and set FERMIX_SANDBOX=auto")
        case "bwrap":
            return Check("sandbox", "warn" if partial else "ok",
                         clip(f"{who}: {report.detail}; limits: {report.limits}", 400),
                         _FIX_LIMITS if partial else None)


def grouped(seen: Mapping[str, float], found: Mapping[str, SandboxReport], now: float,
            ttl_s: float = keys.WORKER_SEEN_TTL_SECONDS) -> list[Check]:
    """The lines for the nodes seen within ``ttl_s`` that wrote a report."""
    groups: dict[str, tuple[list[str], SandboxReport]] = {}
    for node, at in seen.items():
        report = found.get(node)
        if report is None or now - at > ttl_s:
            continue
        groups.setdefault(report.model_dump_json(), ([], report))[0].append(node)
    return [check_sandbox(nodes, report) for nodes, report in groups.values()]


def sandbox_checks(settings: Settings) -> list[Check]:
    """The ``sandbox`` lines; none when Redis cannot be read (the ``redis`` line says why)."""
    r = connect(settings)
    try:
        seen_raw = r.hgetall(keys.workers())
        found = reports(r)
    except redis.RedisError:
        return []
    finally:
        r.close()
    seen = {}
    for node, at in seen_raw.items():
        try:
            seen[node.decode() if isinstance(node, bytes) else node] = float(at)
        except ValueError:
            continue
    return grouped(seen, found, time.time())
