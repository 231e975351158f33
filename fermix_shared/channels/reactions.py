"""Reaction emoji as each platform names them: Telegram takes the Unicode emoji itself (from
its fixed list of reactions), Slack a name (``tada``, ``+1``). A reaction is given either way
(``🎉`` or ``tada``, with or without colons) and translated here for the platform."""

from __future__ import annotations

import re

from fermix_shared.channels.base import ChannelError

# Common reactions both platforms have: the emoji (as Telegram lists it) and Slack's name.
SLACK_NAMES: dict[str, str] = {
    "👍": "+1", "👎": "-1", "❤": "heart", "🔥": "fire", "👏": "clap", "😁": "grin",
    "🤔": "thinking_face", "🤯": "exploding_head", "😱": "scream", "😢": "cry", "🎉": "tada",
    "🤩": "star-struck", "🙏": "pray", "👌": "ok_hand", "😍": "heart_eyes", "💯": "100",
    "🤣": "rolling_on_the_floor_laughing", "⚡": "zap", "🏆": "trophy", "💔": "broken_heart",
    "😐": "neutral_face", "😭": "sob", "👀": "eyes", "🙈": "see_no_evil", "😇": "innocent",
    "🤝": "handshake", "✍": "writing_hand", "🤗": "hugging_face", "🫡": "saluting_face",
    "😎": "sunglasses", "🤷": "shrug", "😡": "rage", "😴": "sleeping", "🤓": "nerd_face",
    "👻": "ghost", "🦄": "unicorn_face", "😘": "kissing_heart", "🆒": "cool",
}
_ALIASES = {"thumbsup": "+1", "thumbsdown": "-1", "thumbs_up": "+1", "thumbs_down": "-1"}
_EMOJI_OF = {name: emoji for emoji, name in SLACK_NAMES.items()}
_NAME = re.compile(r"^:?([a-z0-9_+'-]+):?$")


def _bare(emoji: str) -> str:
    """The emoji without variation selectors (``❤️`` is Telegram's ``❤``)."""
    return emoji.strip().replace("\ufe0f", "")


def _name(emoji: str) -> str | None:
    m = _NAME.match(emoji.strip().lower())
    return None if m is None else _ALIASES.get(m[1], m[1])


def telegram_emoji(emoji: str) -> str:
    """The Unicode emoji Telegram's ``setMessageReaction`` takes for ``emoji``."""
    name = _name(emoji)
    if name is None:
        return _bare(emoji)
    if name not in _EMOJI_OF:
        raise ChannelError(f"no Telegram reaction is known for :{name}:; give the emoji itself")
    return _EMOJI_OF[name]


def slack_name(emoji: str) -> str:
    """The name Slack's ``reactions.add`` takes for ``emoji``."""
    name = _name(emoji)
    if name is not None:
        return name
    bare = _bare(emoji)
    if bare not in SLACK_NAMES:
        raise ChannelError(f"no Slack name is known for {emoji!r}; give its Slack name "
                           "(such as tada or +1)")
    return SLACK_NAMES[bare]
