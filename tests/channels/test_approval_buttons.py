"""The approval buttons' vocabulary, shared by the adapters that draw them and the webhooks that
read them back (fermix_shared/approvals/buttons.py)."""

from __future__ import annotations

import pytest

from fermix_shared.approvals.buttons import (
    SLACK_ACTIONS,
    parse_telegram_callback_data,
    telegram_callback_data,
)
from fermix_shared.approvals.store import new_approval_id


def test_telegram_callback_data_round_trips_within_64_bytes() -> None:
    approval_id = new_approval_id()
    for decision in ("approved", "denied"):
        data = telegram_callback_data(decision, approval_id)
        assert len(data.encode()) <= 64
        assert parse_telegram_callback_data(data) == (decision, approval_id)
    assert telegram_callback_data("approved", "ab12cd34") == "fx:approve:ab12cd34"
    assert telegram_callback_data("denied", "ab12cd34") == "fx:deny:ab12cd34"


@pytest.mark.parametrize("data", [None, "", "fx", "fx:approve", "fx:approve:", "fx:ok:ab12cd34",
                                  "xx:approve:ab12cd34", "fx:approve:AB12CD34",
                                  "fx:approve:ab12cd3", "fx:deny:ab12cd34:extra", "approve"])
def test_anything_but_our_exact_data_is_not_ours(data: str | None) -> None:
    assert parse_telegram_callback_data(data) is None


def test_a_malformed_id_makes_no_button() -> None:
    with pytest.raises(ValueError, match="approval id"):
        telegram_callback_data("approved", "ab12cd34:x")


def test_slack_action_ids_name_the_decision() -> None:
    assert SLACK_ACTIONS == {"fx_approve": "approved", "fx_deny": "denied"}
