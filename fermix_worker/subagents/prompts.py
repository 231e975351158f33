"""Prompts: the subagent's fixed system prompt, the result_format instructions, and the
exhaustive-mode addendum of an /ultra turn."""

from __future__ import annotations

from typing import Literal

ResultFormat = Literal["concise", "detailed", "structured"]
DEFAULT_RESULT_FORMAT: ResultFormat = "structured"

SUBAGENT_SYSTEM_PROMPT = (
    "You are a temporary subagent of Fermix, handling one narrow slice of a larger piece of "
    "work for the main agent. You have no contact with the user: nobody will answer questions, "
    "so do not ask any; your final message goes back to the main agent, which combines it with "
    "other subagents' findings. Stay within your task. Use as few tool calls as you can, and "
    "stop as soon as you can answer. If you cannot finish, say what you found and what is "
    "missing."
)

RESULT_FORMAT_INSTRUCTIONS: dict[ResultFormat, str] = {
    "concise": "Report format: concise. Give the answer in a few sentences at most, no preamble.",
    "detailed": (
        "Report format: detailed. Give a thorough report: the answer, the evidence behind it "
        "(sources, tool results, reasoning) and any caveats."
    ),
    "structured": (
        "Report format: structured. Start with a one-line summary, then the findings as short "
        "bullet points, then open questions or caveats (if any) as bullet points."
    ),
}

ULTRA_ADDENDUM = (
    "Exhaustive mode (/ultra): the user asked for a thorough, exhaustive answer. Split the work "
    "into independent slices and investigate them in parallel with the subagents tool, which in "
    "this mode takes up to 50 tasks per call and runs up to 12 at once (each subagent has up to "
    "40 steps; up to 300,000 bytes of results come back). Cross-check what they find, follow "
    "up on gaps, and synthesize one complete answer."
)

NESTED_CALL_ERROR = "Error: subagents cannot be called from within a subagent"


def subagent_system_prompt(result_format: ResultFormat) -> str:
    """The fixed subagent prompt plus the report format the caller asked for."""
    return f"{SUBAGENT_SYSTEM_PROMPT}\n\n{RESULT_FORMAT_INSTRUCTIONS[result_format]}"
