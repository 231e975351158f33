"""``GET /v1/runs/{id}/wait`` and ``fermix agent`` across a turn resumed on another worker.

When a worker dies mid-turn, the turn resumes elsewhere and its event stream carries a
``lifecycle error`` with ``transient: true`` followed by a new ``lifecycle start``
(fermix_worker/turn.py ``resume``). Neither ``wait`` nor the CLI may take that error for the
run's end (Fased: "gives transient lifecycle errors a short grace window so model/auth retry
can emit a new start").

Also Fased's ``timeoutMs`` on ``wait``, and the run's SSE stream staying open after the
lifecycle end for the turn's post-turn compaction (until it ends, is cleared, or never will).

A real gateway under uvicorn with no worker (db 14), so nothing but the test writes the runs'
records and events: exactly the writes a worker makes, through the same stores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_gateway.api.runs import (
    COMPACTION_FOLLOW_SECONDS,
    DEFAULT_WAIT_SECONDS,
    WAIT_ERROR_GRACE_SECONDS,
)
from fermix_shared import keys
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord, RunStatus, now
from fermix_shared.run_events import (
    AssistantDelta,
    CompactionEnded,
    CompactionScheduled,
    CompactionStarted,
    RunEnded,
    RunFailed,
    RunResuming,
    RunStarted,
)
from fermix_shared.stores import queue, runs
from fermix_shared.stores.events import RunEvents
from tests.conftest import Stack, start_stack
from tests.seed_text import quoted

RESUMING = "the worker running this turn stopped; resuming it on another worker"


@pytest.fixture(scope="module")
def stack(redis_url: str, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("wait", redis_url, 14, {}, logs_dir, workers=0)
    yield s
    s.stop()


@pytest.fixture
def r(stack: Stack) -> Iterator[redis.Redis]:
    client = stack.redis()
    yield client
    client.close()


def running_run(r: redis.Redis) -> RunRecord:
    """A run as a worker leaves it once its turn started."""
    key = ConversationKey(channel="http", chat_id=f"c-{uuid.uuid4().hex[:10]}")
    rec = RunRecord(run_id=f"run_{uuid.uuid4().hex}", conversation=key, status=RunStatus.running,
                    started_at=now(), worker="w1@host")
    runs.put(r, rec)
    RunEvents(r, rec.run_id).emit(RunStarted(started_at=rec.started_at, resumed=False))
    return rec


def end(r: redis.Redis, rec: RunRecord, status: RunStatus, reply: str | None = None,
        error: str | None = None) -> None:
    """What a worker does when the turn ends: the record first, then the terminal event."""
    rec.status, rec.ended_at, rec.reply, rec.error = status, now(), reply, error
    runs.put(r, rec)
    ev = RunEvents(r, rec.run_id)
    if status is RunStatus.error:
        ev.emit(RunFailed(ended_at=rec.ended_at, error=error))
    else:
        ev.emit(RunEnded(ended_at=rec.ended_at, status=status.value, reply=reply))


def following(r: redis.Redis) -> None:
    """Until the gateway's wait is blocked reading run events (this stack's database has no
    other reader): the readiness probe is Redis's own client list."""
    db = r.connection_pool.connection_kwargs["db"]
    wait_until(lambda: any(c["db"] == str(db) and c["cmd"] == "xread" and "b" in c["flags"]
                           for c in r.client_list()),
               10, "the gateway's wait to follow the run's events")


class Waiter(threading.Thread):
    """``GET /v1/runs/{id}/wait`` in the background; ``done`` is set when it answers."""

    def __init__(self, stack: Stack, run_id: str, timeout: float):
        super().__init__(daemon=True)
        self.url = f"{stack.url}/v1/runs/{run_id}/wait"
        self.timeout = timeout
        self.done = threading.Event()
        self.body: dict[str, Any] = {}
        self.elapsed = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            resp = httpx.get(self.url, params={"timeout": self.timeout}, timeout=self.timeout + 10)
            self.body = resp.json()
        finally:
            self.elapsed = time.monotonic() - started
            self.done.set()


def test_a_transient_error_then_a_new_start_keeps_wait_waiting_until_the_end(
    stack: Stack, r: redis.Redis
) -> None:
    rec = running_run(r)
    waiter = Waiter(stack, rec.run_id, timeout=30)
    waiter.start()
    events = RunEvents(r, rec.run_id)
    events.emit(RunResuming(error=RESUMING))
    events.emit(RunStarted(started_at=rec.started_at, resumed=True))
    # Nothing ends the run, so nothing must end the wait: not the error, nor the grace window
    # passing. (A silence can only be observed for a while: twice the grace window.)
    assert not waiter.done.wait(2 * WAIT_ERROR_GRACE_SECONDS), waiter.body
    end(r, rec, RunStatus.ok, reply="Resumed and answered.")
    assert waiter.done.wait(10)
    assert waiter.body["status"] == "ok" and waiter.body["reply"] == "Resumed and answered."


def test_a_transient_error_without_a_new_start_ends_wait_with_the_record_status(
    stack: Stack, r: redis.Redis
) -> None:
    # The run is closed after the error without a terminal event of its own (a worker that
    # died again between the two writes): once the grace window passes, the record decides.
    rec = running_run(r)
    waiter = Waiter(stack, rec.run_id, timeout=30)
    waiter.start()
    following(r)  # past its first look at the record, which is still running
    RunEvents(r, rec.run_id).emit(RunResuming(error=RESUMING))
    errored = time.monotonic()
    rec.status, rec.ended_at, rec.error = RunStatus.error, now(), "Something went wrong."
    runs.put(r, rec)
    assert waiter.done.wait(WAIT_ERROR_GRACE_SECONDS + 5)
    answered = time.monotonic() - errored
    assert waiter.body["status"] == "error" and waiter.body["error"] == "Something went wrong."
    assert WAIT_ERROR_GRACE_SECONDS - 0.5 <= answered < WAIT_ERROR_GRACE_SECONDS + 2


def test_a_transient_error_is_not_the_end_of_a_run_still_running(
    stack: Stack, r: redis.Redis
) -> None:
    # The resume has not emitted its start yet when the grace passes: the run is still
    # running, so wait goes on to its own timeout rather than answer "running".
    rec = running_run(r)
    RunEvents(r, rec.run_id).emit(RunResuming(error=RESUMING))
    timeout = WAIT_ERROR_GRACE_SECONDS + 1.5
    started = time.monotonic()
    body = httpx.get(f"{stack.url}/v1/runs/{rec.run_id}/wait", params={"timeout": timeout},
                     timeout=timeout + 10).json()
    assert body["status"] == "timeout"
    assert time.monotonic() - started >= timeout - 0.5


def test_fermix_agent_prints_the_reply_of_a_resumed_turn(stack: Stack, r: redis.Redis) -> None:
    chat = f"cli-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fermix_cli", "agent", "-m", "hi", "--chat", chat,
         "--timeout", "30"],
        env={**stack.env, "FERMIX_GATEWAY_URL": stack.url},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        inbox = keys.inbox(ConversationKey(channel="http", chat_id=chat).as_str())
        wait_until(lambda: r.llen(inbox) == 1, 15, "the message in its inbox")
        msg = InboundMessage.model_validate_json(r.lindex(inbox, 0))  # type: ignore[arg-type]
        rec = RunRecord(run_id=msg.run_id, conversation=msg.key, status=RunStatus.running,
                        started_at=now(), worker="w1@host")
        runs.put(r, rec)
        events = RunEvents(r, rec.run_id)
        events.emit(RunStarted(started_at=rec.started_at, resumed=False))
        events.emit(AssistantDelta(delta="Hello from "))
        events.emit(RunResuming(error=RESUMING))
        events.emit(RunStarted(started_at=rec.started_at, resumed=True))
        events.emit(AssistantDelta(delta="another worker."))
        end(r, rec, RunStatus.ok, reply="Hello from another worker.")
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "Hello from another worker.\n"


def test_wait_takes_fased_timeout_ms_which_overrides_the_30_s_default(
    stack: Stack, r: redis.Redis
) -> None:
    said = quoted("S", "`agent.wait` default: 30s (just the wait). `timeoutMs` param overrides.")
    assert "30s" in said and DEFAULT_WAIT_SECONDS == 30
    rec = running_run(r)
    url = f"{stack.url}/v1/runs/{rec.run_id}/wait"
    started = time.monotonic()
    body = httpx.get(url, params={"timeoutMs": 1500}, timeout=20).json()
    assert body["status"] == "timeout"
    assert 1.0 <= time.monotonic() - started < 5
    # timeoutMs wins over the seconds parameter; a wait ends only the wait, not the run.
    started = time.monotonic()
    assert httpx.get(url, params={"timeout": 60, "timeoutMs": 200}, timeout=20).json()[
        "status"] == "timeout"
    assert time.monotonic() - started < 5
    assert runs.get(r, rec.run_id).status is RunStatus.running  # type: ignore[union-attr]
    bad = httpx.get(url, params={"timeoutMs": -1}, timeout=20)
    assert bad.status_code == 422 and "timeoutMs" in bad.json()["error"]


class Reader(threading.Thread):
    """``GET /v1/runs/{id}/events`` in the background: the (stream, data) pairs read, and
    ``closed`` once the gateway ended the stream."""

    def __init__(self, stack: Stack, run_id: str):
        super().__init__(daemon=True)
        self.url = f"{stack.url}/v1/runs/{run_id}/events"
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.closed = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("GET", self.url, timeout=60) as resp:
                kind = ""
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        self.seen.append((kind, json.loads(line[5:])))
        finally:
            self.closed.set()

    def phases(self) -> list[tuple[str, str]]:
        return [(kind, data.get("phase", "")) for kind, data in self.seen]


def test_the_run_stream_stays_open_for_the_post_turn_compaction_and_closes_after_it(
    stack: Stack, r: redis.Redis
) -> None:
    # The worker's writes for a turn that crossed the threshold: "scheduled" before the end,
    # then the post-turn job's start and end on the same run stream.
    assert quoted("S", "`compaction`: auto-compaction start/end and retry state")
    rec = running_run(r)
    events = RunEvents(r, rec.run_id)
    events.emit(CompactionScheduled(reason="auto"))
    end(r, rec, RunStatus.ok, reply="Done.")
    reader = Reader(stack, rec.run_id)
    reader.start()
    wait_until(lambda: ("lifecycle", "end") in reader.phases(), 10, "the lifecycle end")
    events.emit(CompactionStarted(reason="auto"))
    events.emit(CompactionEnded(reason="auto", compacted=True, before_tokens=900,
                                after_tokens=120))
    assert reader.closed.wait(10), "the stream closes once the compaction ended"
    assert reader.phases() == [("lifecycle", "start"), ("compaction", "scheduled"),
                               ("lifecycle", "end"), ("compaction", "start"),
                               ("compaction", "end")]
    # wait is the lifecycle's: it answered at the end, compaction or not.
    body = httpx.get(f"{stack.url}/v1/runs/{rec.run_id}/wait", params={"timeoutMs": 100},
                     timeout=10).json()
    assert body["status"] == "ok" and body["reply"] == "Done."


def test_a_post_turn_compaction_cleared_by_stop_closes_the_turns_stream(
    stack: Stack, r: redis.Redis
) -> None:
    rec = running_run(r)
    RunEvents(r, rec.run_id).emit(CompactionScheduled(reason="auto"))
    end(r, rec, RunStatus.ok, reply="Done.")
    # The job waits in the conversation (its worker is busy elsewhere); /stop clears it.
    queue.push_front(r, InboundMessage(key=rec.conversation, text="", kind="compact",
                                       compact_reason="auto", follows_run=rec.run_id))
    stop = httpx.post(f"{stack.url}/v1/agent", timeout=10,
                      json={"message": "/stop", "chatId": rec.conversation.chat_id})
    assert stop.status_code == 202
    reader = Reader(stack, rec.run_id)
    reader.start()
    assert reader.closed.wait(10)
    assert reader.phases()[-2:] == [("lifecycle", "end"), ("compaction", "cancelled")]


def test_an_old_runs_stream_does_not_wait_for_a_compaction_that_never_reported(
    stack: Stack, r: redis.Redis
) -> None:
    # Replayed long after its end (entry ids are write times), a stream whose scheduled
    # compaction never reported closes at once rather than after COMPACTION_FOLLOW_SECONDS.
    run_id = f"run_{uuid.uuid4().hex}"
    old = int((time.time() - COMPACTION_FOLLOW_SECONDS - 60) * 1000)
    for i, (kind, data) in enumerate([("compaction", {"phase": "scheduled", "reason": "auto"}),
                                      ("lifecycle", {"phase": "end", "status": "ok"})]):
        r.xadd(keys.run_events(run_id), {"stream": kind, "data": json.dumps(data)},
               id=f"{old}-{i}")
    runs.put(r, RunRecord(run_id=run_id, conversation=ConversationKey(channel="http", chat_id="o"),
                          status=RunStatus.ok))
    reader = Reader(stack, run_id)
    started = time.monotonic()
    reader.start()
    assert reader.closed.wait(10) and time.monotonic() - started < 5
    assert reader.phases() == [("compaction", "scheduled"), ("lifecycle", "end")]
