# mypy: disallow-untyped-decorators=False
"""The usage Celery task: ``fermix.usage.alert_webhook`` POSTs one budget alert to ``[usage]
alert_webhook``, signed (fermix_worker/usage/alerts.py), and retries it with backoff: the first
wait ``alert_retry_seconds``, doubling, ``alert_attempts`` attempts in all. The URL and the
secret are this worker's settings; only the alert's body travels in the task.
"""

from __future__ import annotations

import logging

from celery import Task

from fermix_shared.celery_app import app
from fermix_shared.task_names import ALERT_WEBHOOK_TASK
from fermix_worker.runtime import Runtime
from fermix_worker.usage.alerts import AlertNotDelivered, post_alert

log = logging.getLogger(__name__)


@app.task(name=ALERT_WEBHOOK_TASK, bind=True, acks_late=True, ignore_result=True,
          max_retries=None)
def alert_webhook(self: Task, body: str) -> str:
    """POST the alert ``body`` (JSON); retried while the webhook does not take it."""
    usage = Runtime.current().settings.usage
    if not usage.alert_webhook or usage.alert_secret is None:
        return "off"
    attempt = self.request.retries + 1
    try:
        post_alert(usage.alert_webhook, usage.alert_secret.get_secret_value(), body)
    except AlertNotDelivered as e:
        if not e.retry or attempt >= usage.alert_attempts:
            log.error("budget alert not delivered to the webhook (attempt %d, given up): %s",
                      attempt, e)
            return "failed"
        wait = usage.alert_retry_seconds * 2 ** (attempt - 1)
        log.warning("budget alert not delivered to the webhook (attempt %d): %s; again in "
                    "%.1f s", attempt, e, wait)
        raise self.retry(countdown=wait) from e
    return "sent"
