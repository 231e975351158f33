"""Owners' budget alerts (OpenFang: "Optionally triggers alerts or pauses the agent").

At ``[usage] warn_at`` of a budget and at its cap, :class:`BudgetAlerts` tells the owners once
per budget, bucket and threshold (``warn``, ``cap``; :func:`~fermix_shared.usage.budgets.
mark_warned`), wherever in the fleet it is noticed first:

* a message into ``[usage] alert_chat`` (the channel send task, retried);
* a POST of the alert as JSON to ``[usage] alert_webhook`` (the webhook task,
  :data:`~fermix_shared.task_names.ALERT_WEBHOOK_TASK`, retried with backoff), signed:
  ``X-Fermix-Timestamp`` (unix seconds) and ``X-Fermix-Signature: sha256=<hex>``, the
  HMAC-SHA256 of ``<timestamp>.<body>`` under ``alert_secret`` (:func:`signature`). The body's
  ``id`` is the same on every attempt, for the receiver to drop a repeat;
* with ``pause_at_cap``, at the cap of an agent's budget, the agent is paused (the lifecycle
  state, audited as ``agent.pause`` by ``budget``) until an owner resumes it.

The warning is noticed after a turn (:class:`~fermix_worker.usage.budgets.WarnOnBudget`), the
cap there too (spending reached 100 %, or a new turn was refused) and when a reservation is
refused (the meter's ``on_cap``). Alerts fail open: an error is logged, the turn goes on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Literal

import httpx
import redis

from fermix_shared import audit
from fermix_shared.agents import lifecycle
from fermix_shared.errors import FermixError
from fermix_shared.settings import Settings
from fermix_shared.task_names import ALERT_WEBHOOK_TASK, SEND_TASK
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import BudgetStatus, format_usd
from fermix_shared.usage.periods import ADJECTIVE, bucket_id, reset_phrase
from fermix_shared.usage.scopes import scope_kind

log = logging.getLogger(__name__)

Threshold = Literal["warn", "cap"]
# Sends a task by name with its arguments (the Celery app's send_task).
SendTask = Callable[[str, list[Any]], object]
SIGNATURE_HEADER = "X-Fermix-Signature"
TIMESTAMP_HEADER = "X-Fermix-Timestamp"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC-SHA256 of ``<timestamp>.<body>`` under ``secret``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def _amounts(status: BudgetStatus) -> str:
    b, spent = status.budget, status.spent
    parts = []
    if b.usd_micros is not None:
        parts.append(f"{format_usd(spent.usd_micros)} of {format_usd(b.usd_micros)}")
    if b.tokens is not None:
        parts.append(f"{spent.tokens:,} of {b.tokens:,} tokens")
    return ", ".join(parts)


def alert_text(status: BudgetStatus, threshold: Threshold, paused: str | None) -> str:
    """The owners' message: which budget, how far, when it resets, and a pause."""
    b = status.budget
    budget = f"the {ADJECTIVE[b.period]} budget of {b.scope}"
    reset = reset_phrase(b.period, status.when)
    if threshold == "warn":
        text = (f"Budget alert: {math.floor(status.share * 100)}% of {budget} is used "
                f"({_amounts(status)}); it resets {reset}.")
    elif status.reached:
        text = (f"Budget reached: {budget} is used up ({_amounts(status)}); its requests are "
                f"refused until it resets {reset}.")
    else:
        text = (f"Budget reached: a model call did not fit what is left of {budget} "
                f"({_amounts(status)}), so it was not made; it resets {reset}.")
    if paused:
        text += (f" The agent {paused} is paused until an owner resumes it "
                 f"(fermix agents resume {paused}).")
    return text


class BudgetAlerts:
    """Tells the owners (module docstring); callable from any thread, never raises."""

    def __init__(self, r: redis.Redis, settings: Settings, send: SendTask,
                 clock: Callable[[], float] = time.time) -> None:
        self._r = r
        self._usage = settings.usage
        self._send = send
        self._clock = clock

    @property
    def enabled(self) -> bool:
        u = self._usage
        return bool(u.alert_chat or u.alert_webhook or u.pause_at_cap)

    def cap(self, status: BudgetStatus) -> None:
        """A reservation was refused by ``status``'s budget."""
        self(status, "cap")

    def __call__(self, status: BudgetStatus, threshold: Threshold) -> None:
        if not self.enabled:
            return
        try:
            if not budgets.mark_warned(self._r, status, f"alert:{threshold}"):
                return
            paused = self._pause(status) if threshold == "cap" else None
            self._tell(status, threshold, paused)
        except Exception as e:
            log.warning("budget alert for %s not sent: %s", budgets.describe(status), e)

    def _pause(self, status: BudgetStatus) -> str | None:
        scope = status.budget.scope
        if not self._usage.pause_at_cap or scope_kind(scope) != "agent":
            return None
        agent = scope.removeprefix("agent:")
        lifecycle.pause(self._r, agent, int(self._clock() * 1000))
        audit.record(self._r, "agent", "agent.pause", "ok", actor="budget", agent=agent,
                     scope=scope, period=status.budget.period, reason="budget cap")
        log.warning("agent %s paused at its budget's cap: %s", agent, budgets.describe(status))
        return agent

    def _tell(self, status: BudgetStatus, threshold: Threshold, paused: str | None) -> None:
        b = status.budget
        alert_id = f"{b.scope}|{b.period}|{bucket_id(b.period, status.when)}|{threshold}"
        text = alert_text(status, threshold, paused)
        log.info("budget alert: %s", text)
        if self._usage.alert_chat:
            self._send(SEND_TASK, [self._usage.alert_chat, text, f"budget-alert:{alert_id}"])
        if self._usage.alert_webhook:
            body = {"id": alert_id, "event": f"budget.{threshold}", "threshold": threshold,
                    "text": text, "pausedAgent": paused,
                    "at": int(self._clock() * 1000), **status.as_json()}
            self._send(ALERT_WEBHOOK_TASK, [json.dumps(body, separators=(",", ":"))])


class AlertNotDelivered(FermixError):  # noqa: N818 - the task's reason to retry
    """The webhook did not take the alert; ``retry`` says whether another attempt may."""

    def __init__(self, reason: str, *, retry: bool = True) -> None:
        super().__init__(reason)
        self.retry = retry


def post_alert(url: str, secret: str, body: str, timeout: float = 10.0,
               clock: Callable[[], float] = time.time) -> None:
    """POST one alert, signed now. Raises :class:`AlertNotDelivered` unless a 2xx answered (a
    4xx other than 408 and 429 is not worth a retry)."""
    raw = body.encode()
    ts = str(int(clock()))
    headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: ts,
               SIGNATURE_HEADER: signature(secret, ts, raw), "User-Agent": "fermix-alerts"}
    try:
        resp = httpx.post(url, content=raw, headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise AlertNotDelivered(f"{type(e).__name__}: {e}") from e
    if not resp.is_success:
        code = resp.status_code
        raise AlertNotDelivered(f"HTTP {code}",
                                retry=code >= 500 or code in (408, 429))
