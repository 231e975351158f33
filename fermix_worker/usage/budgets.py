"""Budgets in the worker: the check before a new turn's first model call, and the warning
after a turn.

* :class:`BudgetGate`: a new turn (a message, a scheduled run) whose agent, conversation, user
  or the total has reached a budget is refused before any model call (preflight compaction
  included): the runner ends it ``error`` with :func:`~fermix_shared.usage.budgets.refusal_text`
  as its reply, the user's message kept in history. Resumed turns are never checked: a turn
  that is running finishes, even past a limit.
* :class:`WarnOnBudget`: a post-turn listener; when the turn's scopes crossed ``warn_at``
  (80 %) of a budget, the conversation gets one notice per scope and period, through its
  channel like compaction's notice (after the reply), and the run a ``diagnostic`` event
  (``kind: budget``): on HTTP, which has no chat, the event is the notice. With ``alerts``,
  the owners are told too, at the warning and at the cap (fermix_worker/usage/alerts.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from fermix_shared.channels.base import ChannelError, OutboundChannel
from fermix_shared.models import Channel, InboundMessage
from fermix_shared.run_events import BudgetWarning
from fermix_shared.settings import Settings
from fermix_shared.stores.events import RunEvents
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import BudgetStatus
from fermix_shared.usage.scopes import turn_scopes

if TYPE_CHECKING:  # the turn package imports this module (the gate)
    from fermix_worker.turn.listeners import TurnEnded
    from fermix_worker.usage.alerts import BudgetAlerts

log = logging.getLogger(__name__)


class BudgetGate:
    """Whether a new turn may start."""

    def __init__(self, r: redis.Redis, settings: Settings,
                 clock: Callable[[], float] = time.time) -> None:
        self._r = r
        self._settings = settings
        self._clock = clock

    def blocking(self, msg: InboundMessage,
                 declared: Mapping[Any, Any] | None = None) -> BudgetStatus | None:
        """The reached budget that refuses ``msg``'s turn, or None. A store error lets the
        turn through (logged): budgets never take the service down. ``declared``: the
        budgets as the caller read them (HGETALL ``keys.budgets()``)."""
        if not self._settings.usage.enabled:
            return None
        try:
            found = budgets.statuses(self._r, turn_scopes(msg), self._clock(), declared)
            block = budgets.blocking(found)
            if block is not None:
                # The refusal says it all: no warning after it for what it reached.
                for s in found:
                    if s.reached:
                        budgets.mark_warned(self._r, s)
        except Exception as e:
            log.warning("budget check for %s failed, letting the turn run: %s", msg.run_id, e)
            return None
        if block is not None:
            log.info("turn %s refused: %s", msg.run_id, budgets.describe(block))
        return block


ChannelLookup = Callable[[Channel], OutboundChannel | None]


class WarnOnBudget:
    """Post-turn listener: the one-time warning at ``warn_at`` of a budget."""

    def __init__(self, r: redis.Redis, settings: Settings, channels: ChannelLookup,
                 clock: Callable[[], float] = time.time,
                 alerts: BudgetAlerts | None = None) -> None:
        self._r = r
        self._settings = settings
        self._channels = channels
        self._clock = clock
        self._alerts = alerts

    def __call__(self, ended: TurnEnded) -> None:
        if not self._settings.usage.enabled:
            return
        msg = ended.msg
        found = budgets.statuses(self._r, turn_scopes(msg), self._clock())
        for status in found:
            if status.share < self._settings.usage.warn_at:
                continue
            if budgets.mark_warned(self._r, status):
                self._warn(msg, status)
            if self._alerts is not None:
                self._alerts(status, "cap" if status.reached else "warn")

    def _warn(self, msg: InboundMessage, status: BudgetStatus) -> None:
        text = budgets.warning_text(status)
        b = status.budget
        log.info("run %s: %s; warned", msg.run_id, budgets.describe(status))
        RunEvents(self._r, msg.run_id).emit(BudgetWarning(
            scope=b.scope, period=b.period, percent=round(status.share * 100, 1), text=text))
        target = msg.deliver_to or msg.key
        channel = self._channels(target.channel)
        if channel is None:
            return
        try:
            channel.send_text(target, text, delivery_id=f"{msg.run_id}:budget:{b.field}")
        except ChannelError as e:
            log.warning("budget warning to %s failed: %s", target.channel, e)
