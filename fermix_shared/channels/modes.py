"""What a channel's conversations do unless told otherwise: the queue mode of a message that
arrives while a turn runs, and how a reply appears while the model writes it.

Both are settings with a per-channel layer (``FERMIX_QUEUE_MODES``, ``FERMIX_TELEGRAM_STREAMING``,
``FERMIX_SLACK_STREAMING``); the gateway, the worker and the local CLI read them through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fermix_shared.models import Channel, QueueMode

if TYPE_CHECKING:
    from fermix_shared.settings import Settings, StreamingMode


def queue_mode_for(settings: Settings, channel: Channel,
                   override: QueueMode | None = None) -> QueueMode:
    """Conversation override, else the channel's mode, else the default."""
    return override or settings.queue_modes.get(channel) or settings.queue_mode


def streaming_for(settings: Settings, channel: Channel) -> StreamingMode:
    """How replies stream into ``channel`` (always ``off`` but on Telegram and Slack)."""
    if channel == "telegram":
        return settings.telegram_streaming
    return settings.slack_streaming if channel == "slack" else "off"
