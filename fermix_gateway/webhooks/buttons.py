"""A press of an approval button, whatever the platform: de-duplicated, trust-checked, answered.

The webhooks (Telegram ``callback_query``, Slack ``block_actions``) parse the press into an
:class:`~fermix_shared.channels.base.ApprovalPress` and hand it to :func:`press`, which answers
it the way ``/approve ID`` / ``/deny ID`` do (:func:`fermix_gateway.approval_answers.answer`: the
first answer wins and resumes the parked turn). Only owners (``operator`` trust) answer;
anyone else is told :data:`~fermix_gateway.approval_answers.GUEST_REFUSAL` and nothing is decided.
A redelivered press (same platform delivery id) decides nothing: it is told where things stand.

Each webhook then shows the outcome its platform's way (the gateway makes no platform call
itself): Telegram in the callback's answer, Slack in the thread; a refusal only to the presser
(Telegram's callback answer, a Slack ephemeral message), never into the chat. A stranger's
presses are counted in the audit trail, not each appended, and the stranger told at most once
an hour.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from fastapi import Request

from fermix_gateway.approval_answers import GUEST_REFUSAL, answer, describe
from fermix_gateway.auth import trust_of
from fermix_gateway.inbound import task_sender
from fermix_shared import audit
from fermix_shared.approvals import store as approvals
from fermix_shared.channels.base import ApprovalPress
from fermix_shared.stores import queue

log = logging.getLogger(__name__)

PressKind = Literal["decided", "answered", "refused", "stranger", "duplicate"]


@dataclass(frozen=True)
class PressOutcome:
    """What came of a press, and the sentence (Markdown) for the presser.

    ``decided``: this press recorded the decision (the turn resumes); ``answered``: an owner's
    press that decided nothing (already answered, no such approval); ``refused``: a guest's;
    ``stranger``: someone neither owner nor allowed; ``duplicate``: a redelivery.
    """

    kind: PressKind
    text: str
    # Whether the presser is to be told at all: a stranger only at its first press in an hour
    # (fermix_shared/audit/refusals.py), so that pressing is no way to make us send.
    tell: bool = True


async def press(request: Request, pressed: ApprovalPress) -> PressOutcome:
    """Answer one press (see the module docstring)."""
    r, settings = request.app.state.redis, request.app.state.settings
    channel = pressed.channel
    if not await queue.first_delivery_async(r, f"{channel}:button:{pressed.dedupe_id}"):
        return PressOutcome("duplicate", await standing(r, pressed.approval_id))
    trust = trust_of(settings, channel, pressed.sender_id)
    if trust != "operator":
        log.warning("refused a %s button press on approval %s from %s:%s (%s)", channel,
                    pressed.approval_id, channel, pressed.sender_id, trust or "unknown")
        actor = f"{channel}:{pressed.sender_id}"
        if trust is None:  # counted, not each appended: a stranger may press all day
            count, _ = await audit.arecord_refusal(r, "check", "approval.answer", actor=actor,
                                                   check="owner_only", trust="stranger")
            return PressOutcome("stranger", GUEST_REFUSAL, tell=count == 1)
        await audit.arecord(r, "check", "approval.answer", "fail", actor=actor,
                            check="owner_only", approval_id=pressed.approval_id[:16],
                            trust=trust)
        return PressOutcome("refused", GUEST_REFUSAL)
    send = task_sender(request)
    resumed: list[str] = []

    async def send_and_note(name: str, args: list[str]) -> None:
        # answer() sends the resume task exactly when this press decided the approval.
        resumed.append(name)
        await send(name, args)

    text = await answer(r, send_and_note, pressed.approval_id, pressed.decision,
                        f"{channel}:{pressed.sender_id}")
    log.info("%s:%s pressed %s on approval %s: %s", channel, pressed.sender_id,
             pressed.decision, pressed.approval_id, "decided" if resumed else "no change")
    return PressOutcome("decided" if resumed else "answered", text)


async def standing(r: aioredis.Redis, approval_id: str) -> str:
    """Where an approval stands, for a press we have already handled."""
    found = await approvals.get_async(r, approval_id)
    if found is None:
        return f"No approval with id {approval_id}."
    if found.status == "pending":
        return f"Approval {approval_id} is waiting for an answer."
    return f"Approval {approval_id} was {describe(found)}."
