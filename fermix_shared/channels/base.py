"""The channel contract, shared by every platform adapter.

Inbound: a webhook parser turns a platform payload into an :class:`InboundEvent` (or nothing:
kinds we ignore are acknowledged and dropped). Outbound: an :class:`OutboundChannel` sends a
reply into the conversation it came from and shows that the agent is working.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from fermix_shared.models import Channel, ConversationKey


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


class ChannelError(Exception):
    """Sending to the platform failed after the adapter's own retries."""


class OutboundChannel(Protocol):
    """A platform's sending side. Implementations must be safe to call from many greenlets."""

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
