"""Loop detection: stop a turn that keeps making the same tool calls without progress.

Four rules, checked for every tool call before it runs, in the order the model asked:

* **Repeats** (seed): a signature is the tool name plus its arguments as JSON with sorted keys.
  In a sliding window of the 10 most recent signatures, the 3rd occurrence of one warns (once
  per signature) and the 5th kills the turn.
* **Ping-pong**: the latest calls alternate between two different signatures (A B A B ...);
  4 alternating calls warn (once per pair), 8 kill.
* **Same-tool streak** (OpenFang's ``max_same_tool_streak``): one tool called 5 times in a row,
  with any arguments, warns (once per tool) with OpenFang's words, "**LOOP DETECTED**: You have
  called the same tool 5 times in a row. ..."; it never kills. A call to another tool ends it.
* **Circuit breaker**: a turn may make at most 250 tool calls; the next one kills it.

The numbers above are the defaults; ``[loop_guard]`` in fermix.toml (or
``FERMIX_LOOP_GUARD__*``) sets them, see :meth:`GuardConfig.from_settings`.

Warnings are text the loop injects as one system message before the next model call
(OpenFang: "the guard injects a system message"); a kill is the turn's error.
:class:`GuardState` is the only state, small and JSON-serializable, so it is checkpointed
with the loop's state. Pure Python, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from fermix_shared.messages import ToolCall

if TYPE_CHECKING:
    from fermix_shared.settings import Settings

REPEAT_WARNING = (
    "Repeated tool call warning: {tool} was called {n} times with the same arguments. "
    "Do not call it again unless the arguments or plan meaningfully change."
)
REPEAT_KILL = "Repeated tool call loop detected: {tool} was called {n} times with the same arguments."
# OpenFang's loop-guard notice, and its ping-pong form in the same words.
STREAK_WARNING = (
    "**LOOP DETECTED**: You have called the same tool {n} times in a row. "
    "Consider a different approach or provide a final answer."
)
PINGPONG_WARNING = (
    "**LOOP DETECTED**: You have alternated between the same two tools ({a} and {b}) {n} times "
    "in a row. Consider a different approach or provide a final answer."
)
PINGPONG_KILL = "Ping-pong tool call loop detected: {a} and {b} keep alternating without progress."
BREAKER_KILL = (
    "Tool call limit reached: this turn made {n} tool calls, the limit is {limit}. "
    "Stopping to avoid a runaway loop."
)

# Warned keys remembered per turn; beyond this the oldest are forgotten (and may warn again).
MAX_WARNED = 64


def signature(call: ToolCall) -> str:
    """The tool name and its normalized arguments (JSON, sorted keys, compact separators)."""
    args = json.dumps(call.arguments, sort_keys=True, separators=(",", ":"), default=str)
    return f"{call.name}:{args}"


def _key(call: ToolCall) -> str:
    """What the state stores for a signature: the tool name and a digest, so a call with a
    large argument (a file body) does not bloat every checkpoint."""
    digest = hashlib.sha256(signature(call).encode()).hexdigest()[:32]
    return f"{call.name}#{digest}"


def _tool_of(key: str) -> str:
    return key.rpartition("#")[0]


class GuardState(BaseModel):
    """Per-turn loop-detection state, embedded in the loop's checkpointed state."""

    # Keys of the most recent calls, oldest first (at most GuardConfig.window).
    window: list[str] = Field(default_factory=list)
    # Keys of the most recent calls for ping-pong (at most GuardConfig.pingpong_kill).
    history: list[str] = Field(default_factory=list)
    # Signature keys and ping-pong pairs ("a|b") already warned about this turn.
    warned: list[str] = Field(default_factory=list)
    total_calls: int = 0
    # The current same-tool streak: the key of its latest call and its length. Defaults keep
    # checkpoints written before the streak rule loadable.
    streak_key: str = ""
    streak: int = 0


@dataclass(frozen=True)
class GuardConfig:
    """Thresholds; the defaults are the seed's (window 10, warn at 3, kill at 5)."""

    window: int = 10
    warn_at: int = 3
    kill_at: int = 5
    pingpong_warn: int = 4
    pingpong_kill: int = 8
    max_tool_calls: int = 250
    streak_warn: int = 5

    @classmethod
    def from_settings(cls, settings: Settings) -> GuardConfig:
        """The thresholds configured in ``settings.loop_guard`` (validated there)."""
        return cls(**settings.loop_guard.model_dump())


@dataclass(frozen=True)
class GuardVerdict:
    """Warnings to thread into the next continuation, and the kill message if the turn must end."""

    warnings: list[str] = field(default_factory=list)
    kill: str | None = None


def _alternation(history: list[str]) -> int:
    """How many of the latest calls alternate between two different keys (0 if not)."""
    if len(history) < 2 or history[-1] == history[-2]:
        return 0
    n = 2
    while n < len(history) and history[-1 - n] == history[-1 - n + 2]:
        n += 1
    return n


class LoopGuard:
    """Applies :class:`GuardConfig` to a turn's :class:`GuardState`."""

    def __init__(self, config: GuardConfig = GuardConfig()) -> None:
        self.config = config

    def observe(self, state: GuardState, calls: list[ToolCall]) -> GuardVerdict:
        """Record ``calls`` (before they run) and judge them. Mutates ``state``.

        Calls are processed in order; the first one that kills returns at once, with the
        warnings raised before it. Each warning is returned once per turn.
        """
        warnings: list[str] = []
        for call in calls:
            kill = self._observe_one(state, call, warnings)
            if kill is not None:
                return GuardVerdict(warnings, kill)
        return GuardVerdict(warnings)

    def _observe_one(self, state: GuardState, call: ToolCall, warnings: list[str]) -> str | None:
        cfg = self.config
        state.total_calls += 1
        if state.total_calls > cfg.max_tool_calls:
            return BREAKER_KILL.format(n=state.total_calls, limit=cfg.max_tool_calls)

        key = _key(call)
        state.window = [*state.window, key][-cfg.window :]
        n = state.window.count(key)
        if n >= cfg.kill_at:
            return REPEAT_KILL.format(tool=call.name, n=n)
        if n >= cfg.warn_at and self._first_warning(state, key):
            warnings.append(REPEAT_WARNING.format(tool=call.name, n=n))

        state.streak = state.streak + 1 if _tool_of(state.streak_key) == call.name else 1
        state.streak_key = key
        if state.streak >= cfg.streak_warn and self._first_warning(state, f"streak:{call.name}"):
            warnings.append(STREAK_WARNING.format(tool=call.name, n=state.streak))

        state.history = [*state.history, key][-max(cfg.pingpong_kill, cfg.pingpong_warn) :]
        run = _alternation(state.history)
        if run >= cfg.pingpong_warn:
            first, second = state.history[-run], state.history[-run + 1]
            a, b = _tool_of(first), _tool_of(second)
            if run >= cfg.pingpong_kill:
                return PINGPONG_KILL.format(a=a, b=b)
            if self._first_warning(state, "|".join(sorted((first, second)))):
                warnings.append(PINGPONG_WARNING.format(a=a, b=b, n=run))
        return None

    @staticmethod
    def _first_warning(state: GuardState, key: str) -> bool:
        """Mark ``key`` as warned; True if it was not already."""
        if key in state.warned:
            return False
        state.warned = [*state.warned, key][-MAX_WARNED:]
        return True
