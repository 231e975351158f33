"""The fleet's housekeeping sweeps: each feature registers what it must look at now and then.

The reaper (:mod:`fermix_worker.fleet.reaper`) runs every registered :class:`Sweep` in its
scan, after the recovery work that is its own; it knows nothing of what a sweep does. The worker
registers the sweeps in one place (:class:`fermix_worker.runtime.Runtime`): approvals (expire
unanswered ones, resume lost resumes), memory reviews (start those that are due), audit
retention.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sweep:
    """One feature's housekeeping: ``run`` does one bounded pass and says how many things it
    acted on. A sweep that raises is logged and skipped for this scan (its work stays for the
    next)."""

    name: str
    run: Callable[[], int]


def run_sweeps(sweeps: Sequence[Sweep]) -> dict[str, int]:
    """Run each sweep once; what each acted on, by name (0 for one that failed)."""
    out: dict[str, int] = {}
    for sweep in sweeps:
        try:
            out[sweep.name] = sweep.run()
        except Exception:
            log.warning("sweep %s failed; trying again next scan", sweep.name, exc_info=True)
            out[sweep.name] = 0
    return out
