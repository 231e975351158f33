"""Helpers for fleet tests: posting messages, waiting on runs, reading run events."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import redis

from fermix_shared import keys


def uniq(prefix: str = "msg") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def post(http: httpx.Client, text: str, chat: str, **extra: Any) -> httpx.Response:
    return http.post("/v1/agent", json={"message": text, "chatId": chat, **extra})


def start(http: httpx.Client, text: str, chat: str) -> str:
    resp = post(http, text, chat)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["runId"])


def wait(http: httpx.Client, run_id: str, timeout: float = 30) -> dict[str, Any]:
    resp = http.get(f"/v1/runs/{run_id}/wait", params={"timeout": timeout}, timeout=timeout + 10)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["status"] != "timeout", f"run {run_id} did not end within {timeout} s"
    return {**http.get(f"/v1/runs/{run_id}").json(), "waited": out}


def events(http: httpx.Client, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """All of a finished run's events (the SSE stream closes at the terminal event)."""
    out: list[tuple[str, dict[str, Any]]] = []
    with http.stream("GET", f"/v1/runs/{run_id}/events", timeout=60) as resp:
        event = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                out.append((event, json.loads(line[5:])))
    return out


def first_event(http: httpx.Client, run_id: str, stream: str, timeout: float = 30) -> dict[str, Any]:
    """Block on the run's SSE stream until its first ``stream`` event (an event, not a sleep)."""
    with http.stream("GET", f"/v1/runs/{run_id}/events", timeout=timeout) as resp:
        event = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == stream:
                return dict(json.loads(line[5:]))
    raise AssertionError(f"run {run_id} ended without a {stream} event")


def terminal_events(r: redis.Redis, run_id: str) -> list[dict[str, Any]]:
    """Every terminal lifecycle event the run's stream holds (read from Redis: all of them).
    A transient error (the turn resumed on another worker) is not an outcome."""
    out = []
    for _id, fields in r.xrange(keys.run_events(run_id)):  # type: ignore[union-attr]
        data = json.loads(fields["data"])
        if (fields["stream"] == "lifecycle" and data["phase"] in ("end", "error")
                and not data.get("transient")):
            out.append(data)
    return out


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def _system_of(body: dict[str, Any]) -> str:
    if isinstance(body.get("system"), str):
        return str(body["system"])
    first = (body.get("messages") or [{}])[0]
    return str(first.get("content", "")) if first.get("role") == "system" else ""


def turn_calls(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The provider requests made by turns: memory reviews (background calls after operator
    turns, which quote the turn) are left out."""
    from fermix_worker.memory_review import REVIEW_SYSTEM

    return [r for r in requests if not _system_of(r["body"]).startswith(REVIEW_SYSTEM[:60])]
