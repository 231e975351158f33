"""The seed's caps for one ``subagents`` call, regular and /ultra, and the fan-out's deadline.

These are system-side numbers, not user configuration; only the per-worker timeout has a
knob (``FERMIX_SUBAGENT_TIMEOUT_SECONDS``, at most the seed's hard maximum of 900 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fermix_shared.models import RunProfile
from fermix_worker.loop_state import ITERATION_CAPS, LoopContext

HARD_MAX_TASKS = 10
HARD_MAX_CONCURRENCY = 8
HARD_MAX_TIMEOUT_S = 900.0
HARD_MAX_ITERATIONS = 100
HARD_MAX_RESULT_BYTES = 60_000

# Time a fan-out may spend waiting for free workers on a busy fleet, on top of its own work.
QUEUE_SLACK_S = 60.0
# After the subagents' deadline, time for the chord callback to reach a worker before the
# reaper treats the parked turn as lost.
CALLBACK_MARGIN_S = 120.0


@dataclass(frozen=True)
class SubagentCaps:
    """Bounds of one ``subagents`` call."""

    max_tasks: int
    concurrency: int
    timeout_s: float
    max_iterations: int
    result_bytes: int
    context: LoopContext

    def budget_s(self, tasks: int) -> float:
        """Seconds the subagents of a call with ``tasks`` tasks may take, all waves included."""
        waves = max(1, math.ceil(tasks / self.concurrency))
        return waves * self.timeout_s + QUEUE_SLACK_S

    def park_s(self, tasks: int) -> float:
        """How long the parked turn waits for the callback before the reaper recovers it."""
        return self.budget_s(tasks) + CALLBACK_MARGIN_S


REGULAR = SubagentCaps(
    max_tasks=10, concurrency=4, timeout_s=300.0, max_iterations=ITERATION_CAPS["subagent"],
    result_bytes=60_000, context="subagent",
)
ULTRA = SubagentCaps(
    max_tasks=50, concurrency=12, timeout_s=300.0,
    max_iterations=ITERATION_CAPS["ultra_subagent"], result_bytes=300_000,
    context="ultra_subagent",
)


def caps_for(profile: RunProfile, timeout_s: float | None = None) -> SubagentCaps:
    """The caps of a call made by a turn with ``profile``; ``timeout_s`` (the settings knob)
    replaces the per-worker timeout, clamped to the hard maximum."""
    caps = ULTRA if profile == "ultra" else REGULAR
    if timeout_s is None:
        return caps
    return SubagentCaps(
        caps.max_tasks, caps.concurrency, min(timeout_s, HARD_MAX_TIMEOUT_S),
        caps.max_iterations, caps.result_bytes, caps.context,
    )
