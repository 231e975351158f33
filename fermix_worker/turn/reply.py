"""Reply shaping: what of the model's text reaches the user.

The model's text reaches the user, the run record, history and every channel unchanged, apart
from the silent token ``NO_REPLY`` (any case). It is a *token*: it is removed only where it
stands as a word (``NO_REPLY_TO=foo`` stays as written), together with one space or tab
before it, and the reply is then trimmed of leading and trailing whitespace. Nothing else is
touched: indentation, runs of spaces and blank lines survive.

A reply that is only the token is *silent*: nothing is delivered, the run ends ``ok`` with an
empty reply, and history gets :data:`SILENT_HISTORY_MARKER`, so a group-chat agent can choose
not to answer. A scheduled job may also answer :data:`SILENT_MARKER`.

A final text that repeats (:func:`repeats_a_sent_message`) a message a ``send_message`` call
already sent is not sent again (Fased: messaging-tool duplicates are removed).

:class:`SilentTokenFilter` applies the same shaping to streamed deltas, holding back only what
could still change, so the concatenated deltas always equal :func:`shape_reply` of the text.
"""

from __future__ import annotations

import re

SILENT_TOKEN = "NO_REPLY"
# A scheduled job's other way of saying "nothing to report this time".
SILENT_MARKER = "[SILENT]"
# What history keeps for a turn that chose not to answer (never the token itself).
SILENT_HISTORY_MARKER = "[chose not to reply]"
# The token as a word, with one space or tab before it.
_TOKEN = re.compile(r"[ \t]?(?<!\w)" + re.escape(SILENT_TOKEN) + r"(?!\w)", re.IGNORECASE)

EMPTY_COMPLETION = "I didn’t get a response — please try again."
TOOL_FAILED_REPLY = "A tool failed and I couldn't finish that: {failure}"


def _remove_token(text: str) -> str:
    return _TOKEN.sub("", text)


def shape_reply(text: str) -> str:
    """The text the user sees: the silent token removed where it stands as a word, trimmed."""
    return _remove_token(text).strip()


def has_silent_token(text: str) -> bool:
    return _TOKEN.search(text) is not None


def is_silent(text: str, *, scheduled: bool = False) -> bool:
    """True for an answer that is only ``NO_REPLY`` (or, for a scheduled run, ``[SILENT]``):
    the run succeeded and nothing is delivered. A truly empty answer is not silent: the user
    gets the seed's "I didn't get a response"."""
    shaped = shape_reply(text)
    if scheduled and shaped.upper() == SILENT_MARKER:
        return True
    return not shaped and has_silent_token(text)


def _normalized(text: str) -> str:
    """``text`` as duplicates are compared: shaped, runs of whitespace as one space, case and
    the closing punctuation ignored."""
    return " ".join(shape_reply(text).split()).casefold().rstrip(" .!…")


def repeats_a_sent_message(text: str, sent: list[str]) -> bool:
    """True when the final ``text`` is (normalized) one a messaging tool already sent into
    the chat this turn: the tool's send was the reply, so the text is not sent again."""
    key = _normalized(text)
    return bool(key) and any(_normalized(s) == key for s in sent)


def empty_turn_reply(tool_failures: list[str]) -> str:
    """What a turn that produced no text says: the failed tool if one failed, else the seed's
    empty-completion message."""
    if tool_failures:
        return TOOL_FAILED_REPLY.format(failure=tool_failures[-1][:500])
    return EMPTY_COMPLETION


def _unsettled_tail(text: str) -> int:
    """Where the part of ``text`` that more text could still change begins: a possible start
    of the token at the end (with the space before it), a token at the very end (the next
    character decides whether it is a word), and trailing whitespace (trimmed at the end)."""
    cut = len(text)
    upper = text.upper()
    for n in range(min(len(SILENT_TOKEN), len(text)), 0, -1):
        if SILENT_TOKEN.startswith(upper[-n:]):
            cut = len(text) - n
            break
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    return cut


class SilentTokenFilter:
    """Shapes streamed deltas exactly as :func:`shape_reply` shapes the whole text.

    ``feed`` returns the text that can be shown now; ``flush`` (at the end of the message)
    returns the rest. Concatenated, they equal ``shape_reply`` of everything fed.
    """

    def __init__(self) -> None:
        self._text = ""
        self._shown = 0

    def feed(self, text: str) -> str:
        self._text += text
        settled = self._text[: _unsettled_tail(self._text)]
        # A token needs the character after it to be judged: the tail held it back, and every
        # token fully inside ``settled`` is judged as it will be in the whole text.
        out = _remove_token(settled).lstrip().rstrip()
        return self._take(out)

    def flush(self) -> str:
        out = self._take(shape_reply(self._text))
        self._text, self._shown = "", 0
        return out

    def _take(self, shaped: str) -> str:
        if len(shaped) <= self._shown:
            return ""
        new = shaped[self._shown :]
        self._shown = len(shaped)
        return new
