"""The channel contract, shared by every platform adapter.

Inbound: a webhook parser turns a platform payload into an :class:`InboundEvent` (or nothing:
kinds we ignore are acknowledged and dropped), or a press of an approval button into an
:class:`ApprovalPress`. Outbound: an :class:`OutboundChannel` sends a reply into the
conversation it came from and shows that the agent is working; one that can also put an
approval question with Approve / Deny buttons is an :class:`AsksApproval` too, one whose
messages can change while a reply is written is an :class:`EditsMessages`, and one that can
react to a message or send a file is a :class:`Reacts` or a :class:`SendsFiles`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from fermix_shared.errors import FermixError
from fermix_shared.models import Channel, ConversationKey

# What a button press answers (the gateway's ``approvals.Decision``).
ApprovalDecision = Literal["approved", "denied"]


@dataclass(frozen=True)
class InboundEvent:
    """One user message from a platform, normalized.

    ``key`` is the conversation (Telegram: chat id + topic; Slack: channel + thread ts).
    ``dedupe_id`` is the platform's delivery id (Telegram ``update_id``, Slack ``event_id``):
    a redelivered webhook carries the same one. ``message_id`` is the platform id of the user's
    message (Telegram ``message_id``, Slack ``ts``), used to react to it or reply to it.
    ``bot_name`` is the bot's username for ``/command@botname`` parsing (Telegram).
    ``answers_inline``: the webhook answers a command in its HTTP response (Slack slash
    commands), so the command's reply is not also sent into the chat.
    """

    key: ConversationKey
    sender_id: str
    text: str
    dedupe_id: str
    message_id: str
    bot_name: str | None = None
    answers_inline: bool = False


@dataclass(frozen=True)
class ApprovalPress:
    """Someone pressed Approve or Deny under an approval question.

    ``sender_id`` is the presser's platform user id (their trust is checked by the gateway, not
    here). ``dedupe_id`` is the platform's delivery id (Telegram ``update_id``, Slack
    ``trigger_id``): a redelivery carries the same one. ``key`` is the conversation the
    question's message is in, where the answer is announced (None when the platform did not
    say).
    """

    channel: Channel
    sender_id: str
    approval_id: str
    decision: ApprovalDecision
    dedupe_id: str
    key: ConversationKey | None = None


class ChannelError(FermixError):
    """Sending to the platform failed after the adapter's own retries."""


class RateLimited(ChannelError):
    """The platform said wait ``retry_after`` seconds (429); nothing was changed."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OutboundChannel(Protocol):
    """A platform's sending side. Implementations must be safe to call from many greenlets.

    Optional capability: ``send_approval`` (see :class:`AsksApproval`; check with
    ``isinstance(channel, AsksApproval)``). It is not part of this protocol so that a channel
    without buttons is still an OutboundChannel."""

    name: Channel

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        """Send ``text`` (Markdown) into the conversation: formatted for the platform, chunked
        under its limit in order, rate-limited, 429s honoured. Idempotent per ``delivery_id``:
        calling again with the same id never sends a chunk twice. Raises ChannelError."""
        ...

    def working(self, key: ConversationKey, message_id: str | None) -> AbstractContextManager[None]:
        """Shows the agent is working while the context is open (Telegram: typing every 4 s for
        at most 5 minutes; Slack: a thread status or an :eyes: reaction), and stops it on exit."""
        ...


@runtime_checkable
class AsksApproval(Protocol):
    """An optional capability of an :class:`OutboundChannel`: put an approval question with
    buttons (Telegram: an inline keyboard; Slack: Block Kit buttons). A channel without it asks
    with :meth:`OutboundChannel.send_text` alone, and people answer ``/approve ID``."""

    def send_approval(self, key: ConversationKey, approval_id: str, text: str, *,
                      delivery_id: str) -> None:
        """Send ``text`` (Markdown, which already names ``/approve ID`` and ``/deny ID``) into
        the conversation with an Approve and a Deny button for ``approval_id`` under it.
        Idempotent per ``delivery_id`` like ``send_text``. Raises ChannelError."""
        ...


@runtime_checkable
class SendsPrivately(Protocol):
    """An optional capability of an :class:`OutboundChannel`: a message only one person of a
    shared chat sees (Slack ``chat.postEphemeral``), for what concerns that person alone (a
    refused button press). A channel without it says nothing then."""

    def send_private(self, key: ConversationKey, user_id: str, text: str) -> None:
        """Show ``text`` (Markdown) to ``user_id`` alone, in the conversation. One attempt, not
        idempotent (nothing lasting is sent). Raises ChannelError."""
        ...


@runtime_checkable
class Reacts(Protocol):
    """An optional capability of an :class:`OutboundChannel`: an emoji reaction on a message
    of the conversation (Telegram ``setMessageReaction``, Slack ``reactions.add``)."""

    def react(self, key: ConversationKey, message_id: str, emoji: str) -> None:
        """Put ``emoji`` (a Unicode emoji, or a Slack name like ``tada``) on the message
        ``message_id``. Idempotent: the same reaction again changes nothing. Raises
        ChannelError (the platform refused the emoji, or the message)."""
        ...


@runtime_checkable
class SendsFiles(Protocol):
    """An optional capability of an :class:`OutboundChannel`: a file into the conversation
    (Telegram ``sendDocument``, Slack's external upload, ``files.uploadV2``)."""

    def send_file(self, key: ConversationKey, data: bytes, filename: str, caption: str, *,
                  delivery_id: str) -> None:
        """Send the file ``filename`` (its bytes, ``data``) with ``caption`` (Markdown, may
        be empty) into the conversation. Idempotent per ``delivery_id`` like ``send_text``.
        Raises ChannelError."""
        ...


@runtime_checkable
class EditsMessages(Protocol):
    """An optional capability of an :class:`OutboundChannel`: one message that changes while a
    reply is written (Telegram ``editMessageText``, Slack ``chat.update``).

    The ``*_live`` calls make one attempt each and never wait: the caller paces them under
    :meth:`live_limits` (fleet-wide, shared with sends) and retries later with newer text; a
    429 blocks the chat's limit for every worker, then raises :class:`RateLimited`."""

    def live_limits(self, key: ConversationKey) -> list[tuple[str, float]]:
        """The rate limits (``RateLimiter`` names and intervals) a change to a message in
        ``key`` is under."""
        ...

    def live_text(self, md: str) -> str:
        """What a live message shows of the Markdown ``md`` written so far: safe while
        incomplete (an unclosed ``**`` must never make the platform refuse it) and cut to the
        platform's first chunk. Blank when there is nothing to show yet."""
        ...

    def post_live(self, key: ConversationKey, shown: str) -> str:
        """Send the first version of a live message (``shown``: from :meth:`live_text`); its
        platform id. Raises RateLimited or ChannelError."""
        ...

    def edit_live(self, key: ConversationKey, message_id: str, shown: str) -> None:
        """Show ``shown`` (from :meth:`live_text`) in the live message; unchanged text is not
        an error. Raises RateLimited or ChannelError."""
        ...

    def delete_live(self, key: ConversationKey, message_id: str) -> None:
        """Remove the live message (a reply that turned out silent). Raises ChannelError."""
        ...

    def finish_live(self, key: ConversationKey, message_id: str, text: str, *,
                    delivery_id: str) -> None:
        """The final reply (Markdown) in place of the live message: its first chunk, formatted,
        edits the message, the others are sent after it as :meth:`OutboundChannel.send_text`
        sends them (paced, 429s honoured, idempotent per ``delivery_id``). A message the
        platform no longer has is sent anew. Raises ChannelError."""
        ...
