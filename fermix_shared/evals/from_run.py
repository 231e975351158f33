"""A real conversation made a case (``fermix eval --from-run RUN``): the recorded turn's
history and message, its agent, its reply as the reference, and expectations to start from
(the tools it called, and a rubric that holds the reply to the reference), so an answer found
in production becomes a regression test once its expectations say what a good one does.

Only what the user saw is kept: history messages with text (tool exchanges and runtime notes
dropped), the message as sent. The run must have a record (the recorder keeps one for
``[recorder] keep_days``).
"""

from __future__ import annotations

from typing import Any

from fermix_shared import recorder as rec
from fermix_shared.errors import UserInputError

REFERENCE_RUBRIC = ("The reply answers the user's last message at least as well as the "
                    "reference reply, and contradicts nothing in it.")


class NotACase(UserInputError, ValueError):
    """The record cannot be a case (the sentence says why)."""


def case_from_recording(recording: rec.Recording) -> dict[str, Any]:
    """The case, as a suite's ``[[case]]`` table (suite.Case's fields)."""
    start, end = recording.start, recording.end
    if start is None:
        raise NotACase(f"run {recording.run_id}'s record has no start (only a turn's record "
                       "can be a case)")
    msg = start.messages[0]
    history = [{"role": m.role, "content": m.content} for m in start.history
               if m.role in ("user", "assistant") and m.content and not m.tool_calls]
    case: dict[str, Any] = {
        "name": f"from {recording.run_id}",
        "messages": ["\n\n".join(m.text for m in start.messages)],
    }
    if history:
        case["history"] = history
    case["agents"] = [msg.agent]
    expect: dict[str, Any] = {}
    tools = sorted({t.call.name for t in recording.tools.values()})
    if tools:
        expect["tool_called"] = tools
    if end is not None and end.outcome == "final" and end.reply:
        case["reference"] = end.reply
        expect["rubric"] = REFERENCE_RUBRIC
    case["expect"] = expect
    return case
