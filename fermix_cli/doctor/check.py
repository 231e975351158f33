"""One line of ``fermix doctor`` (a :class:`Check`), and how a list of them prints and exits.

Exit codes: 0 when every line is ``ok`` or ``warn``; 2 when any line is ``fail``; with
``--strict``, 1 when the worst line is a ``warn``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Level = Literal["ok", "warn", "fail"]

_RANK: dict[Level, int] = {"ok": 0, "warn": 1, "fail": 2}
_NAME_WIDTH = 18
_REDACTED = "<redacted>"


@dataclass(frozen=True)
class Check:
    """What one check found.

    ``name`` says what was checked (``redis.eviction``), ``message`` is one sentence on what
    was found, ``fix`` one sentence on what to do about it (None when there is nothing to do).
    Neither ever holds a secret's value, only whether it is present.
    """

    name: str
    level: Level
    message: str
    fix: str | None = None


def worst(checks: Iterable[Check]) -> Level:
    """The most serious level among ``checks`` (``ok`` for none)."""
    return max((c.level for c in checks), key=_RANK.__getitem__, default="ok")


def exit_code(checks: Sequence[Check], strict: bool = False) -> int:
    """0 when all lines are ok or warn, 2 when any failed; 1 for warnings under ``strict``."""
    level = worst(checks)
    if level == "fail":
        return 2
    return 1 if strict and level == "warn" else 0


def render(checks: Sequence[Check]) -> str:
    """One line per check (level, name, message), its fix indented below, then a summary."""
    lines = []
    for c in checks:
        lines.append(f"{c.level:<5} {c.name:<{_NAME_WIDTH}} {c.message}")
        if c.fix:
            lines.append(f"{'':<5} {'':<{_NAME_WIDTH}} fix: {c.fix}")
    lines.append(summary(checks))
    return "\n".join(lines)


def summary(checks: Sequence[Check]) -> str:
    """The last line: how many checks failed, warned and passed."""
    counts = {level: sum(c.level == level for c in checks) for level in _RANK}
    return f"{counts['fail']} fail, {counts['warn']} warn, {counts['ok']} ok."


def as_json(checks: Sequence[Check], strict: bool = False) -> dict[str, Any]:
    """What ``fermix doctor --json`` prints."""
    return {"worst": worst(checks), "exit_code": exit_code(checks, strict),
            "checks": [asdict(c) for c in checks]}


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every non-empty secret replaced, for messages quoted from elsewhere (an
    SDK's error, a server's description) that might echo what we sent."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, _REDACTED)
    return text


def clip(text: str, limit: int = 200) -> str:
    """One line of at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
