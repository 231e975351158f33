"""What one subagent reports, and the merged tool result the parent's model reads.

Each task gets its share of the call's byte cap (a fair share: what short results leave unused
goes to longer ones, so no result is cut below ``cap / tasks`` bytes); a longer result is cut
on a UTF-8 boundary and flagged ``truncated``. Results come back in task order with a status
per task and summary counts. The merged result is Fermix-authored, so it is not fenced.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Literal

from fermix_shared.records import VersionedRecord
from fermix_worker.tools.base import ToolResult

REPORT_SCHEMA_VERSION = 1
Status = Literal["completed", "failed", "timed_out", "cancelled"]
STATUSES: tuple[Status, ...] = ("completed", "failed", "timed_out", "cancelled")
# Task descriptions are echoed back (to tell results apart) up to this many bytes.
TASK_ECHO_BYTES = 200


class SubagentReport(VersionedRecord):
    """One header task's return value (it crosses from a worker to the chord callback)."""

    SCHEMA_VERSION = REPORT_SCHEMA_VERSION

    index: int
    status: Status
    # The subagent's final answer (completed), else empty.
    output: str = ""
    # Why it did not complete (failed, timed_out, cancelled).
    error: str = ""
    # Wall-clock (unix seconds) between taking a concurrency slot and giving it back.
    started_at: float | None = None
    ended_at: float | None = None
    iterations: int = 0
    worker: str = ""

    @property
    def text(self) -> str:
        return self.output if self.status == "completed" else self.error

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return round(self.ended_at - self.started_at, 2)


def cut_utf8(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` UTF-8 bytes without splitting a character; and
    whether it was cut."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text, False
    # errors="ignore" drops the partial character left at the cut.
    return raw[: max(0, limit)].decode("utf-8", errors="ignore"), True


def byte_shares(sizes: list[int], cap: int) -> list[int]:
    """Each entry's byte allowance: equal shares of ``cap``, with what small entries leave
    unused handed on to larger ones (water-filling). Never more than an entry's size."""
    shares = [0] * len(sizes)
    left = cap
    pending = sorted(range(len(sizes)), key=lambda i: sizes[i])
    while pending:
        fair = left // len(pending)
        i = pending[0]
        if sizes[i] <= fair:
            shares[i] = sizes[i]
            left -= sizes[i]
            pending.pop(0)
            continue
        for j in pending:  # every remaining entry is larger than the fair share
            shares[j] = fair
        break
    return shares


def normalize(raw: list[Any], tasks: list[str]) -> list[SubagentReport]:
    """The header tasks' return values as reports, one per task, in task order. A value that
    is missing or unreadable becomes a ``failed`` entry (the chord itself never fails)."""
    by_index: dict[int, SubagentReport] = {}
    for value in raw:
        try:
            report = SubagentReport.model_validate(value)
        except Exception:
            continue
        if 0 <= report.index < len(tasks):
            by_index[report.index] = report
    return [
        by_index.get(i) or SubagentReport(index=i, status="failed", error="no report came back")
        for i in range(len(tasks))
    ]


def counts(reports: list[SubagentReport]) -> dict[str, int]:
    """``{"tasks": n, "completed": ..., "failed": ..., "timed_out": ..., "cancelled": ...}``."""
    seen = Counter(r.status for r in reports)
    return {"tasks": len(reports), **{s: seen.get(s, 0) for s in STATUSES}}


def merge(tasks: list[str], reports: list[SubagentReport], result_bytes: int) -> ToolResult:
    """The fan-out's tool result: summary counts, then one entry per task, in order."""
    texts = [r.text for r in reports]
    shares = byte_shares([len(t.encode("utf-8")) for t in texts], result_bytes)
    entries: list[dict[str, Any]] = []
    for task, report, text, share in zip(tasks, reports, texts, shares, strict=True):
        echo, echo_cut = cut_utf8(task, TASK_ECHO_BYTES)
        body, cut = cut_utf8(text, share)
        entry: dict[str, Any] = {
            "task": report.index + 1,
            "description": echo + ("…" if echo_cut else ""),
            "status": report.status,
            "result" if report.status == "completed" else "error": body,
            "truncated": cut,
        }
        if report.seconds is not None:
            entry["seconds"] = report.seconds
        entries.append(entry)
    summary = counts(reports)
    doc = {"subagents": summary, "results": entries}
    return ToolResult(
        json.dumps(doc, ensure_ascii=False, indent=1),
        is_error=summary["completed"] == 0,
    )


def refused(message: str) -> ToolResult:
    """A call the fan-out refused before starting anything (bad arguments, too many tasks)."""
    return ToolResult(message, is_error=True)
