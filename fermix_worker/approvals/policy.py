"""Which tool calls wait for a person, and how the question is put.

:class:`ApprovalPolicy` reads ``[approvals]`` (default: every ``exec``-class call, plus tools
named in ``tools``). When the loop meets such a call it returns ``AwaitApproval``; the turn is
parked (:mod:`~fermix_worker.approvals.park`) and :class:`ApprovalAsker` records the request
(:mod:`fermix_shared.approvals.store`) and puts the question in the conversation's channel:
buttons where the platform has them (Telegram inline keyboard, Slack buttons), else the text
with ``/approve ID`` / ``/deny ID``. A turn of a scheduled job asks in its delivery chat, if it
has one; an HTTP conversation has no chat to ask in: its operators answer through
``POST /v1/approvals/{id}`` (``GET /v1/approvals`` lists what waits).

A subagent (or a skill run) asks in its parent turn's chat and parks its own job, not the
parent (:mod:`fermix_worker.subagents.park`); where it cannot park (a run without a claim, a
skill run inside a subagent) a call that needs approval is refused with an error result (see
:data:`SUBAGENT_REFUSAL`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from fermix_shared import audit
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.channels.base import OutboundChannel
from fermix_shared.messages import ToolCall
from fermix_shared.models import Channel, ConversationKey, InboundMessage
from fermix_shared.settings import ApprovalsConfig
from fermix_worker.tools.base import Tool

log = logging.getLogger(__name__)

# The parked turn's lease outlasts the wait by this much: the reaper's expiry (which denies the
# call and resumes the turn) always comes first.
PARK_MARGIN_S = 120.0
ARGS_PREVIEW_CHARS = 600
SUBAGENT_REFUSAL = (
    "Error: tool '{tool}' needs a person's approval, and a subagent cannot ask for it. Leave "
    "this step to the main conversation."
)


class ApprovalPolicy:
    """Whether a tool's calls need approval (``[approvals]``)."""

    def __init__(self, config: ApprovalsConfig):
        self._policies = frozenset(config.policies)
        self._tools = frozenset(config.tools)
        self.timeout_s = config.timeout_seconds

    def needs(self, tool: Tool) -> bool:
        """Fan-out tools (``subagents``, ``skill_run``) never wait: what they start asks for
        its own calls (a subagent parks its own job for them)."""
        if tool.fanout:
            return False
        return tool.policy in self._policies or tool.name in self._tools


def question(req: ApprovalRequest) -> str:
    """The question as the owner reads it."""
    args = json.dumps(req.arguments, ensure_ascii=False, sort_keys=True)
    if len(args) > ARGS_PREVIEW_CHARS:
        args = args[:ARGS_PREVIEW_CHARS] + "…"
    minutes = max(1, round((req.expires_at - req.requested_at) / 60))
    why = f"{req.reason}\n" if req.reason else ""
    return (f"Approval needed ({req.approval_id}): run `{req.tool}` with `{args}`?\n{why}"
            f"Answer /approve {req.approval_id} or /deny {req.approval_id} "
            f"(no answer in {minutes} min denies it).")


def ask_in(msg: InboundMessage) -> ConversationKey | None:
    """The chat the question goes to: the conversation itself, a scheduled run's delivery
    chat, or none (HTTP: answered through the API)."""
    return chat_to_ask(msg.deliver_to if msg.key.channel == "schedule" else msg.key)


def chat_to_ask(key: ConversationKey | None) -> ConversationKey | None:
    """``key``, where a question can be put (None: an HTTP, console or scheduled conversation,
    or none: answered through the API or the console)."""
    if key is None or key.channel in ("http", "schedule", "console"):
        return None
    return key


class ApprovalAsker:
    """Records an approval request and asks for it in the conversation's channel."""

    def __init__(self, r: redis.Redis, policy: ApprovalPolicy,
                 channels: Callable[[Channel], OutboundChannel | None]):
        self._r = r
        self._policy = policy
        self._channels = channels

    def request(self, msg: InboundMessage, call: ToolCall, reason: str = "") -> ApprovalRequest:
        now = time.time()
        return ApprovalRequest(
            approval_id=approvals.new_approval_id(), conv=msg.key.as_str(), run_id=msg.run_id,
            call_id=call.id, tool=call.name, arguments=plain_arguments(call.arguments),
            requester=f"{msg.key.channel}:{msg.sender_id}", ask_in=ask_in(msg),
            requested_at=now, expires_at=now + self._policy.timeout_s, reason=reason,
        )

    def park_seconds(self) -> float:
        return self._policy.timeout_s + PARK_MARGIN_S

    def ask(self, req: ApprovalRequest) -> None:
        """Record ``req``, then put the question (a failed send is logged: the request stands
        and can be answered with /approve anywhere or over HTTP)."""
        approvals.ask(self._r, req)
        if req.ask_in is None:
            return
        channel = self._channels(req.ask_in.channel)
        if channel is None:
            log.warning("approval %s: no %s channel configured to ask in", req.approval_id,
                        req.ask_in.channel)
            return
        try:
            send = getattr(channel, "send_approval", None)
            if send is not None:
                send(req.ask_in, req.approval_id, question(req),
                     delivery_id=f"approval:{req.approval_id}")
            else:
                channel.send_text(req.ask_in, question(req),
                                  delivery_id=f"approval:{req.approval_id}")
        except Exception:
            log.exception("approval %s: could not ask in %s", req.approval_id,
                          req.ask_in.as_str())


def plain_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe arguments (they are stored and shown)."""
    try:
        out: dict[str, Any] = json.loads(json.dumps(arguments, default=str))
        return out
    except (TypeError, ValueError):
        return {"_unprintable": True}


# An answered approval whose parked turn has not taken the answer after this long had its
# resume task lost (a broker hiccup, a gateway that died after deciding): send it again.
APPROVAL_RESEND_S = 30.0


def settle_approvals(r: redis.Redis, resume: Callable[[str], None],
                     now: float | None = None) -> list[str]:
    """Deny every approval whose wait is over and resume its turn; resume again the turns of
    answered approvals whose resume was lost. Returns the approval ids acted on."""
    now = time.time() if now is None else now
    acted = []
    for approval_id in approvals.expired(r, now):
        if approvals.decide(r, approval_id, "expired", "timeout") == "decided":
            log.info("approval %s got no answer in time; denied", approval_id)
            _audit_expired(r, approval_id)
            resume(approval_id)
            acted.append(approval_id)
    for approval_id in approvals.unresumed(r, APPROVAL_RESEND_S, now):
        if approval_id in acted:
            continue
        log.warning("approval %s was answered but its turn did not resume; resuming", approval_id)
        resume(approval_id)
        acted.append(approval_id)
    return acted


def _audit_expired(r: redis.Redis, approval_id: str) -> None:
    found = approvals.get(r, approval_id)
    req = found.request if found is not None else None
    audit.record(r, "approval", "expired", "ok", actor="timeout",
                 run_id=req.run_id if req else "", conv=req.conv if req else "",
                 approval_id=approval_id, tool=req.tool if req else None)
