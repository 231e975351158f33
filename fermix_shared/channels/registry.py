"""The process's outbound channel adapters, built lazily from settings (workers only send)."""

from __future__ import annotations

import logging
import threading

from fermix_shared.channels.base import OutboundChannel
from fermix_shared.models import Channel
from fermix_shared.redis.client import get_redis
from fermix_shared.settings import get_settings

log = logging.getLogger(__name__)

_lock = threading.Lock()
_built: dict[str, OutboundChannel | None] = {}


def _build(channel: Channel) -> OutboundChannel | None:
    settings = get_settings()
    if channel == "telegram":
        if settings.telegram_bot_token is None:
            log.error("a telegram reply is due but FERMIX_TELEGRAM_BOT_TOKEN is not set")
            return None
        from fermix_shared.channels.telegram import TelegramChannel

        return TelegramChannel(settings, get_redis())
    if channel == "slack":
        if settings.slack_bot_token is None:
            log.error("a slack reply is due but FERMIX_SLACK_BOT_TOKEN is not set")
            return None
        from fermix_shared.channels.slack import SlackChannel

        return SlackChannel(settings, get_redis())
    return None  # http: the run record is the delivery


def outbound(channel: Channel) -> OutboundChannel | None:
    """The adapter that sends into ``channel``, or None (HTTP, or a platform not configured)."""
    if channel not in _built:
        with _lock:
            if channel not in _built:
                _built[channel] = _build(channel)
    return _built[channel]
