"""One run of a case, checked against its expectations (all but the rubric, which a model
grades on the worker: fermix_worker/evals/grade.py).

Each failed expectation is one sentence, in the order of :class:`~fermix_shared.evals.suite.
Expect`'s keys, so a report reads the same every time: ``reply does not contain '42'``,
``run_command was called (expected not)``, ``4 steps (at most 3)``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from fermix_shared.evals.suite import MATCHER_KEYS, Expect, ToolExpectation

FENCED_JSON = re.compile(r"^```(?:json)?\s*\n(.*)\n```\s*$", re.DOTALL)


@dataclass(frozen=True)
class CalledTool:
    name: str
    arguments: dict[str, Any]


@dataclass
class Observed:
    """What one run of a case did: its last reply (or the error it ended with), every tool
    call of its turns, its model calls (steps), cost and wall time."""

    reply: str
    ok: bool = True
    error: str = ""
    tool_calls: list[CalledTool] = field(default_factory=list)
    steps: int = 0
    usd: float = 0.0
    latency_s: float = 0.0


def _short(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[:width - 1] + "…")


def reply_json(reply: str) -> Any:
    """The reply as JSON (a fenced ```json block accepted); ValueError when it is none."""
    text = reply.strip()
    if (m := FENCED_JSON.match(text)) is not None:
        text = m.group(1)
    return json.loads(text)


def matches(want: Any, got: Any) -> bool:
    """One argument matcher (suite.ToolExpectation) against the value the call passed."""
    if isinstance(want, dict) and len(want) == 1 and (op := next(iter(want))) in MATCHER_KEYS:
        target = want[op]
        if op == "equals":
            return bool(got == target)
        text = got if isinstance(got, str) else json.dumps(got, ensure_ascii=False)
        return target in text if op == "contains" else re.search(target, text) is not None
    return bool(got == want)


def _called(want: ToolExpectation, calls: list[CalledTool]) -> str | None:
    named = [c for c in calls if c.name == want.name]
    if not named:
        return f"{want.name} was not called"
    for call in named:
        if all(k in call.arguments and matches(v, call.arguments[k]) for k, v in want.args.items()):
            return None
    shown = json.dumps(named[0].arguments, ensure_ascii=False, sort_keys=True)
    return (f"{want.name} was called, but never with arguments matching "
            f"{json.dumps(want.args, ensure_ascii=False, sort_keys=True)} (first: {shown})")


def check(expect: Expect, seen: Observed) -> list[str]:
    """The expectations ``seen`` fails, one sentence each (empty: it passes them all). A run
    that ended in an error fails first of all, and its reply checks are not made."""
    failures: list[str] = []
    if not seen.ok:
        failures.append(f"the run ended in an error: {seen.error or 'no reply'}")
    else:
        reply = seen.reply
        failures += [f"reply does not contain {s!r}" for s in expect.contains if s not in reply]
        failures += [f"reply contains {s!r}" for s in expect.not_contains if s in reply]
        failures += [f"reply does not match /{p}/" for p in expect.regex
                     if re.search(p, reply) is None]
        if expect.json_schema is not None:
            try:
                jsonschema.validate(reply_json(reply), expect.json_schema)
            except ValueError:
                failures.append(f"reply is not JSON: {_short(reply)}")
            except jsonschema.ValidationError as e:
                at = "/".join(str(p) for p in e.absolute_path)
                failures.append(f"reply does not fit the schema{f' at {at}' if at else ''}: "
                                f"{e.message}")
    failures += [f for want in expect.tool_called if (f := _called(want, seen.tool_calls))]
    called = {c.name for c in seen.tool_calls}
    failures += [f"{name} was called (expected not)" for name in expect.tool_not_called
                 if name in called]
    if expect.max_steps is not None and seen.steps > expect.max_steps:
        failures.append(f"{seen.steps} steps (at most {expect.max_steps})")
    if expect.max_cost_usd is not None and seen.usd > expect.max_cost_usd:
        failures.append(f"cost ${seen.usd:.6f} (at most ${expect.max_cost_usd:g})")
    if expect.max_latency_s is not None and seen.latency_s > expect.max_latency_s:
        failures.append(f"took {seen.latency_s:.2f} s (at most {expect.max_latency_s:g} s)")
    return failures
