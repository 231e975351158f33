"""Helpers for fleet tests: posting messages, waiting on runs, reading run events."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import redis

from fermix_dev.procs import wait_until
from fermix_shared import keys
from fermix_shared.messages import ChatMessage


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


def answer(text: str) -> str:
    """The message an answer is to (either way the scripted model answers it)."""
    for prefix, suffix in (("answer to ", ""), ('Scripted reply: you said "', '"')):
        if text.startswith(prefix) and text.endswith(suffix):
            return text[len(prefix):len(text) - len(suffix)]
    return text


def chat_history(r: redis.Redis, chat: str) -> list[tuple[str, str]]:
    """An HTTP chat's user messages and final answers, in order."""
    out: list[tuple[str, str]] = []
    for item in r.lrange(keys.history(f"http|{chat}|root"), 0, -1):  # type: ignore[union-attr]
        msg = ChatMessage.model_validate_json(item)
        if msg.role in ("user", "assistant") and not msg.tool_calls:
            out.append((msg.role, str(msg.content)))
    return out


def post_until_accepted(urls: list[str], chat: str, text: str, message_id: str,
                        first: int = 0, headers: dict[str, str] | None = None) -> str:
    """POST until accepted, trying the gateways in turn from ``urls[first % len]``; a
    connection error or a 5xx (a gateway restarting) is retried with the same messageId, so
    a message that got through is answered as a duplicate."""
    deadline = time.monotonic() + 30
    body = {"message": text, "chatId": chat, "messageId": message_id}
    i = first
    while True:
        try:
            resp = httpx.post(f"{urls[i % len(urls)]}/v1/agent", json=body, timeout=5,
                              headers=headers, trust_env=False)
            if resp.status_code == 202:
                return str(resp.json()["runId"])
            assert resp.status_code >= 500, resp.text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{text} never accepted"
        i += 1
        if i % len(urls) == first % len(urls):
            time.sleep(0.1)  # every gateway refused: give them a moment


class RollingTraffic:
    """Traffic for a rolling restart: each of ``chats`` chats sends ``per_chat`` messages in
    order through ``urls``, a share of them as each of ``steps`` restart steps begins
    (:meth:`step` lets them go), ``pause_s`` apart: a steady flow, not a burst."""

    def __init__(self, urls: list[str], tag: str, *, chats: int, per_chat: int, steps: int,
                 pause_s: float, headers: dict[str, str] | None = None):
        self.urls, self.tag, self.chats, self.per_chat = urls, tag, chats, per_chat
        self.headers = headers
        self.pause_s = pause_s
        self.steps = [threading.Event() for _ in range(steps)]
        self.accepted = 0
        self._lock = threading.Lock()

    def text(self, c: int, n: int) -> str:
        return f"{self.tag} c{c:02d} #{n:02d}"

    def chat(self, c: int) -> str:
        return f"{self.tag}-c{c:02d}"

    def send_chat(self, c: int) -> list[str]:
        """Chat ``c``'s messages, each once accepted; their run ids."""
        out = []
        for n in range(self.per_chat):
            self.steps[n * len(self.steps) // self.per_chat].wait(120)
            out.append(post_until_accepted(self.urls, self.chat(c), self.text(c, n),
                                           f"{self.tag}-{c}-{n}", first=c + n,
                                           headers=self.headers))
            with self._lock:
                self.accepted += 1
            time.sleep(self.pause_s)  # no event to wait for: the pace is the point
        return out

    def step(self, i: int, accepted: int, timeout: float) -> None:
        """Let step ``i``'s messages go; return once ``accepted`` more are in (turns in
        flight)."""
        before = self.accepted
        self.steps[i].set()
        wait_until(lambda: self.accepted >= before + accepted, timeout, f"step {i}'s messages")
