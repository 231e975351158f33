"""TurnRunner: the entry points of a turn, one per way a worker comes to hold one.

* :meth:`~TurnRunner.run`: a new message (:mod:`~fermix_worker.turn.start`: prepare, run,
  deliver and commit); :meth:`~TurnRunner.compact_turn`: a compaction job in the
  conversation's order;
* :meth:`~TurnRunner.resume` (a turn whose worker died, from its checkpoint),
  :meth:`~TurnRunner.resume_fanout` (a parked turn, when its fan-out's results arrive),
  :meth:`~TurnRunner.resume_approval` (a parked turn, when its approval is answered) and
  :meth:`~TurnRunner.close_orphan` (:mod:`~fermix_worker.turn.resume`).

Each returns a :data:`~fermix_worker.turn.outcome.TurnOutcome`, inside the turn's span
(:mod:`~fermix_worker.turn.spans`; a resume once its message is known). A started or resumed turn runs
its loop in :mod:`~fermix_worker.turn.proceed`; every way a turn ends is in
:mod:`~fermix_worker.turn.close`. What the turn runs on is one
:class:`~fermix_worker.turn.wiring.TurnWiring`: the Runtime passes its own to :meth:`wired`.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from fermix_shared.hooks import HookRegistry
from fermix_shared.models import InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry
from fermix_shared.stores.lease import TurnLease
from fermix_worker.providers import Router
from fermix_worker.subagents.contract import FanOut, NoFanOut
from fermix_worker.tools.base import ToolRegistry, ToolResult
from fermix_worker.turn.delivery import ChannelLookup
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.turn.outcome import TurnOutcome
from fermix_worker.turn.proceed import Proceed
from fermix_worker.turn.resume import TurnResumer
from fermix_worker.turn.spans import ended, turn_span
from fermix_worker.turn.start import TurnStarter
from fermix_worker.turn.wiring import TurnParts, TurnWiring, no_channels


class TurnRunner:
    """The turn's entry points over one wiring (module docstring)."""

    def __init__(
        self,
        r: redis.Redis,
        settings: Settings,
        tools: ToolRegistry,
        router: Callable[[], Router],
        channels: ChannelLookup = no_channels,
        hooks: HookRegistry | None = None,
        fanout: FanOut | None = None,
        listeners: TurnListeners | None = None,
        skills: SkillRegistry | None = None,
    ):
        wiring = TurnWiring(r, settings, tools, router, channels, hooks or HookRegistry(),
                            fanout or NoFanOut(), listeners or TurnListeners(), skills)
        parts = TurnParts(wiring)
        proceed = Proceed(parts)
        self._start = TurnStarter(parts, proceed)
        self._resume = TurnResumer(parts, proceed)

    @classmethod
    def wired(cls, w: TurnWiring) -> TurnRunner:
        """The runner of a wiring built elsewhere (the Runtime's)."""
        return cls(w.redis, w.settings, w.tools, w.router, w.channels, w.hooks, w.fanout,
                   w.listeners, w.skills)

    # -- a new message ---------------------------------------------------------------------

    def run(self, messages: list[InboundMessage], lease: TurnLease) -> TurnOutcome:
        """Run the claimed turn (messages[0], plus any merged into it)."""
        with turn_span(messages[0], lease.worker, "start") as span:
            return ended(span, self._start.run(messages, lease))

    def compact_turn(self, msg: InboundMessage, lease: TurnLease) -> TurnOutcome:
        """A compaction in the conversation's order (``auto`` or /compact)."""
        with turn_span(msg, lease.worker, "compact") as span:
            return ended(span, self._start.compact(msg, lease))

    # -- a turn taken back -----------------------------------------------------------------

    def resume(self, msg: InboundMessage, lease: TurnLease, attempt: int) -> TurnOutcome:
        """Continue a turn whose worker died, from its last checkpoint."""
        with turn_span(msg, lease.worker, "after_crash") as span:
            return ended(span, self._resume.after_crash(msg, lease, attempt))

    def resume_fanout(
        self, conv: str, run_id: str, call_id: str, result: ToolResult, worker: str,
        tool_name: str = "subagents",
    ) -> TurnOutcome:
        """The fan-out's callback: take the parked turn back, answer its call, continue."""
        return self._resume.after_fanout(conv, run_id, call_id, result, worker, tool_name)

    def resume_approval(self, approval_id: str, worker: str) -> TurnOutcome:
        """An approval was answered (or expired, or was cancelled): continue its turn."""
        return self._resume.after_approval(approval_id, worker)

    def close_orphan(self, msg: InboundMessage, lease: TurnLease, cancelled: str) -> TurnOutcome:
        """A turn whose worker died and that will not be resumed."""
        with turn_span(msg, lease.worker, "close_orphan") as span:
            return ended(span, self._resume.close_orphan(msg, lease, cancelled))
