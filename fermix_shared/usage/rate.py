"""The token-rate breaker: at most N tokens a minute per agent, fleet-wide, for the loop that a
budget in dollars would only notice after an hour.

An agent's limit is its ``[[agents]] tokens_per_minute``, else ``[usage]
agent_tokens_per_minute`` (neither: no limit). Its calls (the turn's, its subagents' and skill
runs', its compaction and memory review) count in fixed UTC minutes. The check is part of the
call's budget reservation (``usage_reserve.lua``, no round trip of its own): the call's worst
case (the prompt as sent plus ``max_tokens``) must fit what is left of the agent's minute, and
is counted there; ``usage_record.lua`` settles it to the provider-reported tokens (a failed
call gives it back). A minute with nothing counted yet takes any one call, so an agent whose
prompt alone is larger than its rate still makes one call a minute. A call that does not fit
is refused (:class:`RateLimited`) with :func:`rate_text` as the turn's reply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from fermix_shared.agents.definitions import AgentDefinition

WINDOW_S = 60


@dataclass(frozen=True)
class TokenRate:
    """``agent``'s calls may take ``per_minute`` tokens a minute."""

    agent: str
    per_minute: int


@dataclass(frozen=True)
class RateLimited:
    """The agent's minute has no room for the call: ``used`` tokens are counted in it, and it
    frees up at ``frees_at`` (unix time, the next minute)."""

    rate: TokenRate
    used: int
    frees_at: float


def minute_of(now: float) -> int:
    """The UTC minute of ``now`` (unix time), as the window's id."""
    return int(now // WINDOW_S)


def frees_at(now: float) -> float:
    """When the minute of ``now`` ends."""
    return float((minute_of(now) + 1) * WINDOW_S)


def rates_of(agents: Sequence[AgentDefinition], default: int | None) -> dict[str, int]:
    """Each declared agent's tokens per minute (its own, else ``default``), for those that
    have one; an agent not declared here gets ``default``."""
    out = {a.name: a.tokens_per_minute or default for a in agents}
    return {name: n for name, n in out.items() if n}


def rate_text(limited: RateLimited, worst_tokens: int, now: float) -> str:
    """The reply of a turn stopped by the breaker: the rate, and when it frees up."""
    wait = max(1, math.ceil(limited.frees_at - now))
    at = datetime.fromtimestamp(limited.frees_at, UTC).strftime("%H:%M:%S")
    return (f"I stopped here: this agent is limited to {limited.rate.per_minute:,} tokens a "
            f"minute, {limited.used:,} are taken this minute and the next step could take "
            f"up to {worst_tokens:,} more; it frees up at {at} UTC (in {wait} "
            f"second{'' if wait == 1 else 's'}).")
