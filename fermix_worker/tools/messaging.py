"""Tools whose success is itself the reply: ``react`` and ``send_message``.

``react`` puts an emoji reaction on the user's message that started the turn (Telegram
``setMessageReaction``, Slack ``reactions.add``); ``send_message`` sends a message, or a
workspace file with a caption, into the turn's chat (a scheduled run's: where it delivers).
Either is a reply (``Tool.delivers``): a turn that made one and then has no text closes
silently with a compact history marker (seed), and a final text that repeats what
``send_message`` sent is not sent again (:mod:`fermix_worker.turn.close`).

Both are safe to run again after a worker crash (``idempotent``): a reaction set twice is one
reaction, and a send is marked per turn and per call's arguments the way a reply's chunks are
(``keys.delivered``), so a re-run skips what went out. Subagents never get them (they have no
chat of their own: :mod:`fermix_worker.subagents.registry` leaves out every ``delivers`` tool).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from fermix_shared.channels.base import ChannelError, OutboundChannel, Reacts, SendsFiles
from fermix_shared.models import Channel
from fermix_shared.settings import Settings
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.context import RunContext, TurnContext
from fermix_worker.tools.workspace import turn_workspace

REACT = "react"
SEND_MESSAGE = "send_message"
# The largest file send_message sends (Telegram bots may upload up to 50 MB).
MAX_FILE_BYTES = 20 * 1024 * 1024

_REACT_PARAMS: dict[str, Any] = {"type": "object", "properties": {
    "emoji": {"type": "string", "description": "one emoji, e.g. 👍 ❤ 🔥 🎉 👀 👌 🙏 🤔 💯 👏"},
}, "required": ["emoji"]}

_SEND_PARAMS: dict[str, Any] = {"type": "object", "properties": {
    "text": {"type": "string", "description": "the message (Markdown); with a file, its caption"},
    "path": {"type": "string", "description": "a workspace file to send (relative to its root)"},
}}


class MessagingTools:
    """``react`` and ``send_message`` over the process's channels (``channels``: a
    platform's sender, None for HTTP or a platform not configured)."""

    def __init__(self, channels: Callable[[Channel], OutboundChannel | None],
                 settings: Settings):
        self._channels = channels
        self._settings = settings

    def react(self, ctx: RunContext, args: dict[str, Any]) -> str:
        turn = _turn(ctx)
        emoji = str(args.get("emoji") or "").strip()
        if not emoji:
            raise ToolError("emoji is required")
        if turn.key.channel == "schedule" or not turn.reply_to:
            raise ToolError("there is no message of the user's to react to in this turn")
        channel = self._channels(turn.key.channel)
        if not isinstance(channel, Reacts):
            raise ToolError(f"reactions are not available in this conversation "
                            f"({turn.key.channel}); answer in words instead")
        try:
            channel.react(turn.key, turn.reply_to, emoji)
        except ChannelError as e:
            raise ToolError(f"the reaction was not added: {e}") from e
        return f"Reacted {emoji} to the user's message."

    def send_message(self, ctx: RunContext, args: dict[str, Any]) -> str:
        turn = _turn(ctx)
        text, path = str(args.get("text") or ""), str(args.get("path") or "").strip()
        if not text.strip() and not path:
            raise ToolError("give the text to send, a file's path, or both")
        target = turn.origin
        channel = None if target is None else self._channels(target.channel)
        if target is None or channel is None:
            raise ToolError("this conversation has no chat to send into; put it in your reply")
        delivery_id = _delivery_id(turn, args)
        try:
            if not path:
                channel.send_text(target, text, delivery_id=delivery_id)
                return "Sent to the chat."
            if not isinstance(channel, SendsFiles):
                raise ToolError(f"files cannot be sent in this conversation ({target.channel})")
            name, data = self._read(turn, path)
            channel.send_file(target, data, name, text, delivery_id=delivery_id)
        except ChannelError as e:
            raise ToolError(f"the message was not sent: {e}") from e
        return f"Sent {name} to the chat."

    def _read(self, turn: TurnContext, raw: str) -> tuple[str, bytes]:
        ws = turn_workspace(self._settings, turn)
        path = ws.resolve(raw)
        fd = ws.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ToolError(f"{ws.rel(path)} is larger than {MAX_FILE_BYTES // 2**20} MB")
        return PurePath(path).name, data

    def tools(self) -> list[Tool]:
        return [
            Tool(REACT, (
                "React to the user's message with an emoji, as a person would (an "
                "acknowledgement). A reaction can be the whole reply: then answer with no text."),
                _REACT_PARAMS, self.react, delivers="reaction"),
            Tool(SEND_MESSAGE, (
                "Send a message, or a workspace file (`path`) with `text` as its caption, into "
                "this chat now, before your reply. What you send is part of the reply: do not "
                "repeat it in your final answer (answer with no text if nothing is left)."),
                _SEND_PARAMS, self.send_message, delivers="message"),
        ]


def _turn(ctx: RunContext) -> TurnContext:
    if ctx.turn is None:
        raise ToolError("this tool only works inside a conversation's turn")
    return ctx.turn


def _delivery_id(turn: TurnContext, args: dict[str, Any]) -> str:
    """One per turn and arguments: a send re-run after a crash resumes its marks (nothing
    twice), and the same message sent twice in one turn goes out once."""
    digest = hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()
    return f"{turn.run_id}:send:{digest[:16]}"


def messaging_tools(channels: Callable[[Channel], OutboundChannel | None],
                    settings: Settings) -> list[Tool]:
    """``react`` and ``send_message`` over ``channels``."""
    return MessagingTools(channels, settings).tools()


__all__ = ["MAX_FILE_BYTES", "REACT", "SEND_MESSAGE", "MessagingTools", "messaging_tools"]
