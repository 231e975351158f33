"""What our Approve / Deny buttons carry, on each platform, both ways.

The worker's channel adapters put the buttons under an approval question; the gateway's
webhooks read the press back. Both sides use the vocabulary here, so the two cannot drift:

- Telegram: an inline keyboard whose ``callback_data`` is ``fx:approve:<id>`` or
  ``fx:deny:<id>`` (Telegram allows 1-64 bytes; ours are 19 at most).
- Slack: an ``actions`` block with two buttons, ``action_id`` ``fx_approve`` / ``fx_deny`` and
  the approval id as their ``value``.

Approval ids are 8 lowercase hex characters (:mod:`fermix_shared.approvals.store`).
"""

from __future__ import annotations

from fermix_shared.approvals.store import valid_id
from fermix_shared.channels.base import ApprovalDecision as Decision

APPROVE_LABEL = "Approve"
DENY_LABEL = "Deny"

_TELEGRAM_PREFIX = "fx"
_TELEGRAM_VERBS: dict[str, Decision] = {"approve": "approved", "deny": "denied"}

SLACK_APPROVE_ACTION = "fx_approve"
SLACK_DENY_ACTION = "fx_deny"
SLACK_ACTIONS: dict[str, Decision] = {SLACK_APPROVE_ACTION: "approved",
                                      SLACK_DENY_ACTION: "denied"}


def telegram_callback_data(decision: Decision, approval_id: str) -> str:
    """``fx:approve:<id>`` or ``fx:deny:<id>``; ValueError for a malformed id."""
    if not valid_id(approval_id):
        raise ValueError(f"not an approval id: {approval_id!r}")
    verb = "approve" if decision == "approved" else "deny"
    return f"{_TELEGRAM_PREFIX}:{verb}:{approval_id}"


def parse_telegram_callback_data(data: str | None) -> tuple[Decision, str] | None:
    """The decision and approval id a button of ours carries; None for anything else (other
    buttons, or data that is not exactly one of ours)."""
    if not data:
        return None
    prefix, _, rest = data.partition(":")
    verb, _, approval_id = rest.partition(":")
    decision = _TELEGRAM_VERBS.get(verb)
    if prefix != _TELEGRAM_PREFIX or decision is None or not valid_id(approval_id):
        return None
    return decision, approval_id
