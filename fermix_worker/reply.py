"""Reply shaping: what of the model's text reaches the user.

``NO_REPLY`` (any case) is a silent token: it never reaches a user, on its own or inside other
text, neither in the final reply nor in the streamed deltas.
"""

from __future__ import annotations

import re

SILENT_TOKEN = "NO_REPLY"
# A scheduled job's other way of saying "nothing to report this time".
SILENT_MARKER = "[SILENT]"
_SILENT = re.compile(re.escape(SILENT_TOKEN), re.IGNORECASE)

EMPTY_COMPLETION = "I didn’t get a response — please try again."
TOOL_FAILED_REPLY = "A tool failed and I couldn't finish that: {failure}"


def shape_reply(text: str) -> str:
    """The text the user sees: the silent token removed wherever it stands."""
    return re.sub(r"[ \t]{2,}", " ", _SILENT.sub("", text)).strip()


def is_silent(text: str) -> bool:
    """True for a scheduled run's answer that is only ``NO_REPLY`` or ``[SILENT]``: the run
    succeeded and nothing is delivered."""
    shaped = shape_reply(text)
    return shaped.upper() == SILENT_MARKER or (not shaped and bool(_SILENT.search(text)))


def empty_turn_reply(tool_failures: list[str]) -> str:
    """What a turn that produced no text says: the failed tool if one failed, else the seed's
    empty-completion message."""
    if tool_failures:
        return TOOL_FAILED_REPLY.format(failure=tool_failures[-1][:500])
    return EMPTY_COMPLETION


class SilentTokenFilter:
    """Filters streamed deltas so the silent token never goes out, even split across deltas.

    Text that could still become the token is held back until it cannot, or until ``flush``.
    """

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        buf = _SILENT.sub("", self._held + text)
        keep = 0
        upper = buf.upper()
        for n in range(min(len(SILENT_TOKEN) - 1, len(buf)), 0, -1):
            if SILENT_TOKEN.startswith(upper[-n:]):
                keep = n
                break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out
