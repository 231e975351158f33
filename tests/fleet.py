"""Helpers for fleet tests: posting messages, waiting on runs, reading run events."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from fermix_dev.procs import wait_until
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.models import RunRecord, RunStatus, now
from fermix_shared.run_events import RunEnded
from fermix_shared.stores import runs
from fermix_shared.stores.events import RunEvents


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
    """All of a finished run's events (the SSE stream closes at the terminal event, or after
    it at the end of the post-turn compaction scheduled before it)."""
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
    from fermix_worker.memory.review import REVIEW_SYSTEM

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


# -- load that retries through a failover --------------------------------------------------


@dataclass
class Sent:
    """One message a :class:`PostingChat` sent, and what became of its attempts."""

    chat: str
    text: str
    message_id: str
    first_try: float  # time.time()
    acked: float | None = None
    run_id: str | None = None
    errors: list[tuple[float, int]] = field(default_factory=list)  # (when, status; 0 = no answer)


class PostingChat(threading.Thread):
    """Posts to one chat every ``period_s`` until stopped, each message until it is
    acknowledged: a refusal (or no answer) is retried after ``retry_s`` with the same
    messageId, as a platform retries a webhook."""

    def __init__(self, base_url: str, chat: str, stop: threading.Event, period_s: float,
                 retry_s: float = 0.1):
        super().__init__(daemon=True)
        self.base_url, self.chat, self.stop = base_url, chat, stop
        self.period_s, self.retry_s = period_s, retry_s
        self.sent: list[Sent] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                msg = Sent(self.chat, f"{self.chat} message {n}", uniq("mid"), time.time())
                self.sent.append(msg)
                while msg.acked is None and not self.stop.is_set():
                    try:
                        resp = http.post("/v1/agent", json={
                            "message": msg.text, "chatId": self.chat, "messageId": msg.message_id})
                        status = resp.status_code
                    except httpx.HTTPError:
                        status = 0
                    if 200 <= status < 300:
                        msg.acked, msg.run_id = time.time(), resp.json()["runId"]
                    else:
                        msg.errors.append((time.time(), status))
                        self.stop.wait(self.retry_s)
                self.stop.wait(self.period_s)


@contextmanager
def posting_chats(base_url: str, prefix: str, chats: int, period_s: float
                  ) -> Iterator[list[PostingChat]]:
    """``chats`` :class:`PostingChat` threads posting until the block ends (then joined)."""
    stop = threading.Event()
    out = [PostingChat(base_url, uniq(prefix), stop, period_s) for _ in range(chats)]
    for c in out:
        c.start()
    try:
        yield out
    finally:
        stop.set()
        for c in out:
            c.join(10)


def all_sent(chats: list[PostingChat]) -> list[Sent]:
    return [m for c in chats for m in c.sent]


def wait_acked(chats: list[PostingChat], n: int, timeout: float) -> None:
    """Until ``n`` messages are acknowledged in all (steady load)."""
    deadline = time.monotonic() + timeout
    while sum(1 for m in all_sent(chats) if m.acked) < n:
        assert time.monotonic() < deadline, "no steady load before the kill"
        time.sleep(0.05)


def finished_runs(http: httpx.Client, acked: list[Sent], timeout: float
                  ) -> dict[str, dict[str, Any]]:
    """Each acknowledged message's run once it has ended (``timeout`` s each), by messageId."""
    out = {}
    for m in acked:
        assert m.run_id is not None
        done = http.get(f"/v1/runs/{m.run_id}/wait", params={"timeout": timeout},
                        timeout=timeout + 10)
        assert done.status_code == 200, done.text
        out[m.message_id] = http.get(f"/v1/runs/{m.run_id}").json()
    return out


def repeated_replies(r: redis.Redis, chats: list[str]) -> list[Any]:
    """Every extra copy of a reply in an HTTP chat's history (an answer given twice)."""
    out = []
    for chat in chats:
        history = [ChatMessage.model_validate_json(x) for x in
                   r.lrange(keys.history(f"http|{chat}|root"), 0, -1)]  # type: ignore[union-attr]
        replies = [h.content for h in history if h.role == "assistant"]
        out += [t for i, t in enumerate(replies) if t in replies[:i]]
    return out


# -- Telegram through a real gateway --------------------------------------------------------


def telegram_say(url: str, secret: str, user: int, chat: int, text: str,
                 ids: Iterator[int]) -> None:
    """``user`` writes ``text`` in the private chat ``chat``: the update, posted to the
    gateway's webhook at ``url`` with the webhook ``secret``; ids drawn from ``ids``."""
    update: dict[str, Any] = {"update_id": next(ids), "message": {
        "message_id": next(ids), "date": int(time.time()), "text": text,
        "from": {"id": user, "is_bot": False, "first_name": "Ada"},
        "chat": {"id": chat, "type": "private", "first_name": "Ada"},
    }}
    resp = httpx.post(f"{url}/webhooks/telegram", json=update, timeout=10,
                      headers={"X-Telegram-Bot-Api-Secret-Token": secret})
    assert resp.status_code == 200, resp.text


# -- long-poll waits on runs the test writes (no worker) ------------------------------------


def end_run(r: redis.Redis, rec: RunRecord) -> None:
    """What a worker does when a turn ends: the record, then the terminal event."""
    rec.status, rec.ended_at, rec.reply = RunStatus.ok, now(), f"reply to {rec.run_id}"
    runs.put(r, rec)
    RunEvents(r, rec.run_id).emit(RunEnded(ended_at=rec.ended_at, status="ok", reply=rec.reply))


def command_calls(r: redis.Redis, command: str) -> int:
    """How many times Redis has run ``command`` (INFO commandstats)."""
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def open_waits(client: httpx.AsyncClient, r: redis.Redis, recs: list[RunRecord],
                     timeout: float) -> list[asyncio.Task[httpx.Response]]:
    """A ``/wait`` per run, returned once every wait has read its record (within
    ``timeout``) and the gateway has read events twice since."""
    gets = command_calls(r, "get")
    waits = [asyncio.create_task(client.get(f"/v1/runs/{rec.run_id}/wait",
                                            params={"timeout": 30})) for rec in recs]
    await asyncio.to_thread(wait_until, lambda: command_calls(r, "get") >= gets + len(recs),
                            timeout, f"the {len(recs)} waits open")
    xreads = command_calls(r, "xread")
    await asyncio.to_thread(wait_until, lambda: command_calls(r, "xread") >= xreads + 2, 5,
                            "the waits reading events")
    return waits


async def wait_answers(waits: list[asyncio.Task[httpx.Response]]) -> list[tuple[int | str, Any]]:
    """Each wait's (status code, run status), or (the error's name, None)."""
    out: list[tuple[int | str, Any]] = []
    for w in waits:
        try:
            resp = await w
            out.append((resp.status_code, resp.json().get("status")))
        except httpx.HTTPError as e:
            out.append((type(e).__name__, None))
    return out
