"""The model-graded rubric: a grader model reads the conversation, the reply (and a known good
reply, when the case has one) and answers PASS or FAIL with a sentence.

The grader's first line decides (``PASS``/``FAIL``, case and markdown emphasis ignored); an
answer that is neither fails the case, quoting what the grader said. The grader never sees
the agent's tools or prompt, only what the user would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fermix_shared.messages import ChatMessage
from fermix_worker.loop import CompletingProvider
from fermix_worker.providers.base import ModelRequest, ModelTurn

GRADER_SYSTEM = (
    "You grade an AI agent's reply against a rubric. Answer PASS or FAIL on the first line, "
    "then one sentence saying why. Judge only what the rubric asks."
)
GRADER_MAX_TOKENS = 400
_VERDICT = re.compile(r"^[\s*_`#>\"']*(PASS|FAIL)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Grade:
    passed: bool
    reason: str
    turn: ModelTurn | None = None


def grader_prompt(conversation: list[ChatMessage], reply: str, rubric: str,
                  reference: str | None) -> str:
    """What the grader is asked (the conversation as the user saw it: no tool exchanges)."""
    said = "\n".join(f"{m.role}: {m.content}" for m in conversation
                     if m.role in ("user", "assistant") and m.content and not m.tool_calls)
    parts = [f"Rubric:\n{rubric}", f"Conversation:\n{said}", f"The agent's reply:\n{reply}"]
    if reference:
        parts.append(f"A reference reply, known to be good:\n{reference}")
    parts.append("Does the agent's reply meet the rubric? First line: PASS or FAIL.")
    return "\n\n".join(parts)


def verdict(text: str) -> Grade:
    """The grader's answer read: its first line's PASS or FAIL, and the rest as the reason."""
    stripped = text.strip()
    m = _VERDICT.match(stripped)
    if m is None:
        shown = " ".join(stripped.split())[:120] or "nothing"
        return Grade(False, f"the grader answered neither PASS nor FAIL: {shown!r}")
    rest = stripped[m.end():].lstrip(" \t\n*_`:.-—").rstrip()
    return Grade(m.group(1).upper() == "PASS", " ".join(rest.split())[:300])


def grade(provider: CompletingProvider, model: str, conversation: list[ChatMessage], reply: str,
          rubric: str, reference: str | None) -> Grade:
    """Ask ``provider`` (on ``model``) whether ``reply`` meets ``rubric``."""
    prompt = grader_prompt(conversation, reply, rubric, reference)
    turn = provider.chat(ModelRequest(model=model, system=GRADER_SYSTEM,
                                      messages=[ChatMessage(role="user", content=prompt)],
                                      max_tokens=GRADER_MAX_TOKENS), lambda _: None)
    g = verdict(turn.content)
    return Grade(g.passed, g.reason, turn)
