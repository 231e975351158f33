"""Post-turn compaction: a listener that queues a compaction job after a turn that crossed the
threshold, so it runs next in the conversation's order, after the reply.

Its events are the turn's: ``compaction`` ``scheduled`` on the turn's run stream before the
lifecycle end (listeners run before it), then the job's ``start`` and ``end``/``error`` on the
same stream after it (the job ``follows_run``), where the SSE stream waits for them.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from fermix_shared import keys
from fermix_shared.models import InboundMessage
from fermix_shared.run_events import CompactionScheduled
from fermix_shared.stores import queue
from fermix_shared.stores.events import RunEvents
from fermix_worker.compaction.conversation import ConversationCompactor
from fermix_worker.turn.listeners import TurnEnded


class ScheduleCompaction:
    """Post-turn listener: when an interactive turn that was delivered crossed the threshold,
    a compaction job runs next in its conversation (after the reply), then ``kick`` dispatches."""

    def __init__(self, r: redis.Redis, compactor: ConversationCompactor,
                 kick: Callable[[str], None]):
        self._r = r
        self._compactor = compactor
        self._kick = kick

    def __call__(self, ended: TurnEnded) -> None:
        msg = ended.msg
        if msg.context != "interactive" or ended.record.status.value == "stopped":
            return
        conv = msg.key.as_str()
        # The measurement the turn just saved, when it saved one (not read back); the backoff
        # is read only when it crossed.
        if ended.measured is not None:
            if not self._compactor.crosses(ended.measured) or self._r.exists(
                    keys.compact_backoff(conv)):
                return
        elif not self._compactor.needed(conv):
            return
        # Announced first: a reader of the turn's stream knows, before its end, to wait on.
        RunEvents(self._r, msg.run_id).emit(CompactionScheduled(reason="auto"))
        # The turn's agent and sender: the summary call is charged to them.
        queue.push_front(self._r, InboundMessage(
            key=msg.key, text="", kind="compact", compact_reason="auto", reply_to=msg.reply_to,
            agent=msg.agent, sender_id=msg.sender_id, follows_run=msg.run_id))
        self._kick(conv)
