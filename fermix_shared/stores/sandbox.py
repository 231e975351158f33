"""Each worker's command sandbox, as it found it at start: the ``sandbox`` line of
``fermix doctor`` and the ``sandbox`` of each worker in ``GET /v1/status``.

A worker probes its host once (fermix_worker/tools/sandbox.py, cgroups.py) and writes one
:class:`SandboxReport` per node into ``keys.workers_sandbox()``; the gateway and the CLI run
elsewhere, so they read what the workers wrote instead of probing their own host. A report
outlives its worker; readers show only the workers whose heartbeat is fresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from fermix_shared import keys
from fermix_shared.records import VersionedRecord

# bwrap: commands run in bubblewrap; unavailable: bwrap is needed (auto, bwrap) and cannot run,
# so run_command is not offered; none: FERMIX_SANDBOX=none, commands run on the host.
SandboxState = Literal["bwrap", "unavailable", "none"]


class SandboxReport(VersionedRecord):
    """How one worker runs commands: ``state`` under ``mode``, ``detail`` (one sentence: where
    and with what isolation, or why not), ``limits`` (what binds a whole command: cgroup or
    per process only), and whether the model is offered ``run_command`` at all (no workspace:
    nothing to run commands in)."""

    mode: Literal["auto", "bwrap", "none"]
    state: SandboxState
    detail: str
    limits: str
    run_command: bool


def publish(r: redis.Redis, node: str, report: SandboxReport) -> None:
    """Record ``node``'s report (a worker, once at start)."""
    r.hset(keys.workers_sandbox(), node, report.model_dump_json())


def _parse(raw: Mapping[Any, Any]) -> dict[str, SandboxReport]:
    out = {}
    for node, value in raw.items():
        try:
            out[node.decode() if isinstance(node, bytes) else node] = (
                SandboxReport.model_validate_json(value))
        except ValidationError:
            continue  # another release's record: shown as unknown
    return out


def reports(r: redis.Redis) -> dict[str, SandboxReport]:
    """Every node's report, by node name."""
    return _parse(r.hgetall(keys.workers_sandbox()))  # type: ignore[arg-type,unused-ignore]


async def reports_async(r: aioredis.Redis) -> dict[str, SandboxReport]:
    return _parse(await r.hgetall(keys.workers_sandbox()))


def report_json(report: SandboxReport | None) -> dict[str, object] | None:
    """A report on the wire (``/v1/status``): camelCase, None when the worker wrote none."""
    if report is None:
        return None
    return {"mode": report.mode, "state": report.state, "detail": report.detail,
            "limits": report.limits, "runCommand": report.run_command}
