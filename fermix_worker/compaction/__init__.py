"""Compaction: summarizing older history into a checkpoint when a conversation nears its
model's context window.

``summary`` plans the cut and makes the summary call (pure planning, one model call);
``conversation`` decides when a conversation needs it and rewrites its stored history;
``step`` runs it in the conversation's order (preflight, overflow recovery, the post-turn job,
/compact) with its events, hooks and notices.
"""

from fermix_worker.compaction.summary import (
    CHECKPOINT_PREFIX,
    OVERFLOW_MESSAGE,
    OVERFLOW_RECOVERING,
    POST_TURN_NOTICE,
    PREFLIGHT_NOTICE,
    SUMMARY_INSTRUCTION,
    Compactor,
    estimate_tokens,
    plan,
)

__all__ = [
    "CHECKPOINT_PREFIX",
    "OVERFLOW_MESSAGE",
    "OVERFLOW_RECOVERING",
    "POST_TURN_NOTICE",
    "PREFLIGHT_NOTICE",
    "SUMMARY_INSTRUCTION",
    "Compactor",
    "estimate_tokens",
    "plan",
]
