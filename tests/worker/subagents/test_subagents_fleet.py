"""The subagents tool across real worker processes: a chord whose waiting parent holds no
worker slot, a concurrency cap that holds whatever the pool size, failures and timeouts as
entries, /stop reaching subagents everywhere, and /ultra's wider caps.

One worker at a time runs here (its pool size is what some tests are about); each subagent
takes ~1 s (a scripted model delay), so waves are easy to see in the start/end times the
fan-out reports on the parent run's events.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import Managed, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail, Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.redis.broker import FULL_SLICE_S
from fermix_worker.subagents.prompts import ULTRA_ADDENDUM
from fermix_worker.turn import STOPPED_MARKER
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, max_overlap, post, start, uniq, wait
from tests.seed_text import quoted


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_CANCEL_POLL_SECONDS": "0.2"}
    s = start_stack("subagents", redis_url, 7, env, logs_dir, workers=0)
    yield s
    s.stop()


@contextmanager
def worker(stack: Stack, name: str, concurrency: int, **env: str) -> Iterator[Managed]:
    """Exactly one worker process, with this pool size and extra environment."""
    base = stack.env
    stack.env = {**base, **env}
    try:
        w = stack.start_worker(name, concurrency)
    finally:
        stack.env = base
    try:
        yield w
    finally:
        w.stop()
        stack.workers.remove(w)
        stack.procs.remove(w)


@pytest.fixture(scope="module")
def w8(stack: Stack) -> Iterator[Managed]:
    """A worker of concurrency 8 with the default per-worker timeout (for the later tests)."""
    with worker(stack, "sub-w8", 8) as w:
        yield w


def script_fanout(llm: ScriptedLLMServer, user: str, tasks: list[str], *extra: Any) -> None:
    """The parent fans ``tasks`` out, then answers; ``extra`` scripts the subagents."""
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks})], match=user),
        *extra,
        Reply(text=f"synthesized for {user}", match=user),
    )


def parent_requests(llm: ScriptedLLMServer, user: str) -> list[dict[str, Any]]:
    """The parent turn's model calls: its last user message is the user's text."""
    def last_user(req: dict[str, Any]) -> str:
        users = [m for m in req["body"]["messages"] if m["role"] == "user"]
        return str(users[-1]["content"]) if users else ""

    return [r["body"] for r in llm.script.requests if last_user(r) == user]


def advertised(request: dict[str, Any]) -> str:
    """The subagents tool's description as a model request carried it."""
    for tool in request.get("tools") or []:
        spec = tool.get("function", tool)  # OpenAI nests it; Anthropic does not
        if spec.get("name") == "subagents":
            return str(spec["description"])
    raise AssertionError("the request offered no subagents tool")


def fanout_end(http: httpx.Client, run_id: str) -> dict[str, Any]:
    """The fan-out's summary event: per-task status and start/end times."""
    (end,) = [d for e, d in events(http, run_id)
              if e == "diagnostic" and d.get("kind") == "subagents" and d.get("phase") == "end"]
    return end


def waves(tasks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group subagents into waves, by start time: a subagent that started after one of the
    current wave had ended (it took a freed slot) begins the next wave."""
    out: list[list[dict[str, Any]]] = []
    for t in sorted(tasks, key=lambda t: t["startedAt"]):
        if out and t["startedAt"] < min(x["endedAt"] for x in out[-1]):
            out[-1].append(t)
        else:
            out.append([t])
    return out


def run_ten(stack: Stack, llm: ScriptedLLMServer, seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ten subagents of about ``seconds`` each (a scripted model delay)."""
    user = uniq("fan")
    tasks = [uniq(f"slice{i}") for i in range(10)]
    script_fanout(llm, user, tasks,
                  *[Reply(text=f"found {t}", delay=seconds, match=t) for t in tasks])
    with stack.http() as http:
        run = wait(http, start(http, user, uniq("chat")), timeout=60)
        end = fanout_end(http, run["runId"])
    assert run["status"] == "ok" and run["reply"] == f"synthesized for {user}"
    assert [t["status"] for t in end["tasks"]] == ["completed"] * 10
    tool_result = json.loads(parent_requests(llm, user)[-1]["messages"][-1]["content"])
    assert [e["result"] for e in tool_result["results"]] == [f"found {t}" for t in tasks]
    return run, end


def describe(end: dict[str, Any]) -> str:
    t0 = min(t["startedAt"] for t in end["tasks"])
    return ", ".join(f"{t['startedAt'] - t0:.2f}-{t['endedAt'] - t0:.2f}" for t in
                     sorted(end["tasks"], key=lambda t: t["startedAt"]))


def test_ten_subagents_on_one_worker_of_four_run_in_three_waves(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Subagents of 2.5 s: the waves are three whatever the refill latency (the next test holds
    # that to a drain slice).
    with worker(stack, "sub-w4", 4):
        _, end = run_ten(stack, llm, 2.5)
    spans = [(t["startedAt"], t["endedAt"]) for t in end["tasks"]]
    print("c=4 waves:", describe(end))
    # Four at once: the parked parent holds none of the four worker slots.
    assert max_overlap(spans) == 4
    assert [len(w) for w in waves(end["tasks"])] == [4, 4, 2]


def test_timeouts_and_failures_are_entries_and_the_parent_answers(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    user = uniq("mixed")
    ok1, bad, slow, ok2 = (uniq(x) for x in ("ok1", "bad", "slow", "ok2"))
    script_fanout(
        llm, user, [ok1, bad, slow, ok2],
        Reply(text="first done", match=ok1), Fail(400, "no such model", match=bad),
        Reply(text="far too late", delay=10, match=slow), Reply(text="second done", match=ok2),
    )
    with worker(stack, "sub-wt", 8, FERMIX_SUBAGENT_TIMEOUT_SECONDS="2"), stack.http() as http:
        began = time.monotonic()
        run = wait(http, start(http, user, uniq("chat")), timeout=30)
        took = time.monotonic() - began
        end = fanout_end(http, run["runId"])
    assert run["status"] == "ok" and run["reply"] == f"synthesized for {user}"
    assert took < 8, f"the 2 s per-worker timeout did not hold ({took:.1f} s)"
    assert [t["status"] for t in end["tasks"]] == ["completed", "failed", "timed_out", "completed"]
    assert end["counts"] == {"tasks": 4, "completed": 2, "failed": 1, "timed_out": 1, "cancelled": 0}
    slow_span = end["tasks"][2]["endedAt"] - end["tasks"][2]["startedAt"]
    assert 1.9 <= slow_span < 4, slow_span
    # The parent's final model call read every status in the merged (unfenced) result.
    final = parent_requests(llm, user)[-1]["messages"][-1]
    assert final["role"] == "tool" and "untrusted_tool_result" not in final["content"]
    doc = json.loads(final["content"])
    assert doc["subagents"] == end["counts"]
    assert [e["status"] for e in doc["results"]] == [
        "completed", "failed", "timed_out", "completed"]
    assert "HTTP 400" in doc["results"][1]["error"] or "no such model" in doc["results"][1]["error"]
    assert "2 s time limit" in doc["results"][2]["error"]


def subagent_worker(stack: Stack, run_id: str, index: int) -> str:
    """The worker a subagent of ``run_id`` started on (from its ``start`` diagnostic)."""
    for _id, fields in stack.redis().xrange(keys.run_events(run_id)):  # type: ignore[union-attr]
        data = json.loads(fields["data"])
        if data.get("kind") == "subagent" and data.get("phase") == "start" and (
                data.get("index") == index):
            return str(data["worker"])
    return ""


def test_a_subagent_on_a_killed_worker_is_rerun_and_the_parent_gets_its_report(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Without a prompt re-run the broker would redeliver the header task after its visibility
    # timeout (an hour) and the parent would read "interrupted" at its fan-out deadline.
    user, quick, doomed = uniq("rerun"), uniq("quick"), uniq("doomed")
    script_fanout(
        llm, user, [quick, doomed],
        Reply(text=f"found {quick}", match=quick),
        Reply(text="never", delay=120, match=doomed),  # its worker dies in this call
        Reply(text=f"found {doomed}", match=doomed),
    )
    with worker(stack, "sub-k1", 4) as k1, worker(stack, "sub-k2", 4) as k2, \
            stack.http() as http:
        run_id = start(http, user, uniq("chat"))
        wait_until(lambda: any(q["body"]["messages"][-1].get("content") == doomed
                               for q in llm.script.requests), 30, "the doomed subagent's call")
        holder = subagent_worker(stack, run_id, 1)
        victim = next(w for w in (k1, k2) if holder.startswith(w.name + "@"))
        killed_at = time.monotonic()
        os.killpg(victim.pid, signal.SIGKILL)
        victim.proc.wait()
        run = wait(http, run_id, timeout=60)
        took = time.monotonic() - killed_at
        end = fanout_end(http, run["runId"])
    print(f"kill -> parent answered: {took:.1f} s")
    assert run["status"] == "ok" and run["reply"] == f"synthesized for {user}"
    assert took < 20, f"the subagent was not re-run promptly ({took:.1f} s)"
    assert [t["status"] for t in end["tasks"]] == ["completed", "completed"]
    assert not end["tasks"][1]["worker"].startswith(victim.name + "@")
    doc = json.loads(parent_requests(llm, user)[-1]["messages"][-1]["content"])
    assert [e["result"] for e in doc["results"]] == [f"found {quick}", f"found {doomed}"]
    # The re-run made one more model call, not two: the dead one and the one that answered.
    assert sum(1 for q in llm.script.requests
               if q["body"]["messages"][-1].get("content") == doomed) == 2
    # Both reports were counted: the reaper watches no subagent any more.
    wait_until(lambda: stack.redis().hlen(keys.subagents_running()) == 0, 5,
               "no subagent left to watch")


def test_the_cap_of_four_holds_on_a_worker_of_eight(
    stack: Stack, llm: ScriptedLLMServer, w8: Managed
) -> None:
    _, end = run_ten(stack, llm, 1.0)
    spans = [(t["startedAt"], t["endedAt"]) for t in end["tasks"]]
    print("c=8 waves:", describe(end))
    assert max_overlap(spans) == 4
    # Eight of the ten header tasks fit the pool; the four waiting ones take freed fan-out
    # slots at once, and the last two reach the worker within a drain slice of the pool
    # slots freeing (it was Celery's 2 s poll while the pool was full: an expected failure
    # until issue 31).
    assert [len(w) for w in waves(end["tasks"])] == [4, 4, 2], describe(end)


def test_a_released_slot_is_taken_at_once_so_the_waves_are_tight(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Issue 17: ten 1 s subagents, cap 4, on a worker whose pool holds them all. A subagent
    # that found no free slot waits for one (a wake-up on every release), so each wave starts
    # as the one before ends, not on a retry through the broker (0.4-0.6 s later, or more).
    with worker(stack, "sub-w12", 12):
        _, end = run_ten(stack, llm, 1.0)
    tasks = end["tasks"]
    print("c=12 waves:", describe(end))
    assert max_overlap([(t["startedAt"], t["endedAt"]) for t in tasks]) == 4
    grouped = waves(tasks)
    assert [len(w) for w in grouped] == [4, 4, 2]
    ends = sorted(t["endedAt"] for t in tasks)
    # Each subagent of waves two and three started within 0.25 s of the release it took.
    for i, t in enumerate(sorted([*grouped[1], *grouped[2]], key=lambda t: t["startedAt"])):
        assert t["startedAt"] - ends[i] < 0.25, describe(end)


def test_stop_cancels_the_subagents_and_nothing_is_delivered(
    stack: Stack, llm: ScriptedLLMServer, w8: Managed
) -> None:
    user, chat = uniq("stopme"), uniq("chat")
    tasks = [uniq(f"long{i}") for i in range(3)]
    script_fanout(llm, user, tasks, *[Reply(text="never", delay=20, match=t) for t in tasks])
    with stack.http() as http:
        run_id = start(http, user, chat)
        r = stack.redis()
        # Until all three subagents are in their model call.
        wait_until(lambda: sum(1 for q in llm.script.requests
                               if q["body"]["messages"][-1].get("content") in tasks) == 3,
                   20, "three subagents calling the model")
        stopped_at, stopped_wall = time.monotonic(), time.time()
        stop = wait(http, start(http, "/stop", chat))
        assert stop["reply"] == "Stopped the current request and cleared 0 queued messages."
        run = wait(http, run_id, timeout=15)
        took = time.monotonic() - stopped_at
        end = fanout_end(http, run_id)
    assert run["status"] == "stopped" and "reply" not in run
    assert took < 5, f"the subagents were not cancelled quickly ({took:.1f} s)"
    assert [t["status"] for t in end["tasks"]] == ["cancelled"] * 3
    # Each subagent let go well before its 20 s model call would have answered.
    print("cancelled after /stop:", [round(t["endedAt"] - stopped_wall, 2) for t in end["tasks"]])
    assert all(t["endedAt"] - stopped_wall < 3 for t in end["tasks"])
    assert len(parent_requests(llm, user)) == 1  # the parent never called the model again
    history = [json.loads(m)["content"] for m in r.lrange(keys.history(f"http|{chat}|root"), 0, -1)]
    assert history == [user, STOPPED_MARKER]


def test_ultra_raises_the_caps(stack: Stack, llm: ScriptedLLMServer, w8: Managed) -> None:
    tasks = [uniq(f"wide{i}") for i in range(12)]
    normal, ultra = uniq("normal"), uniq("ultra")
    script_fanout(llm, normal, tasks)
    script_fanout(llm, ultra, tasks, *[Reply(text=f"ok {t}", match=t) for t in tasks])
    with stack.http() as http:
        refused = wait(http, start(http, normal, uniq("chat")))
        resp = post(http, ultra, uniq("chat"), profile="ultra")
        assert resp.status_code == 202, resp.text
        done = wait(http, resp.json()["runId"], timeout=60)
    assert refused["status"] == "ok" and done["status"] == "ok"
    (first, second) = parent_requests(llm, normal)
    assert second["messages"][-1]["content"] == (
        "Error: too many tasks: 12 given, at most 10 per subagents call. Split the work or "
        "merge tasks.")
    assert ULTRA_ADDENDUM not in first["messages"][0]["content"]
    assert "Up to 10 tasks per call, 4 at a time" in advertised(first)
    (first, second) = parent_requests(llm, ultra)
    assert ULTRA_ADDENDUM in first["messages"][0]["content"]
    # The model is told the wider caps before it plans (the seed's /ultra caps table).
    tasks = quoted("F", "Max tasks per subagents call 50").rsplit(" ", 1)[1]
    at_once = quoted("F", "Max concurrency 12").rsplit(" ", 1)[1]
    assert f"Up to {tasks} tasks per call, {at_once} at a time" in advertised(first)
    doc = json.loads(second["messages"][-1]["content"])
    assert doc["subagents"]["completed"] == 12


def test_a_worker_of_four_refills_each_freed_slot_from_the_broker_at_once(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    # Issue 31: ten 1 s subagents, cap 4, on a worker whose pool holds only four. A freed pool
    # slot takes the next header task from the broker within the transport's drain slice
    # (fermix_shared/redis/broker.py, FULL_SLICE_S), not at Celery's 2 s poll.
    with worker(stack, "sub-w4b", 4):
        _, end = run_ten(stack, llm, 1.0)
    tasks = end["tasks"]
    print("c=4, 1 s waves:", describe(end))
    assert max_overlap([(t["startedAt"], t["endedAt"]) for t in tasks]) == 4
    grouped = waves(tasks)
    assert [len(w) for w in grouped] == [4, 4, 2], describe(end)
    ends = sorted(t["endedAt"] for t in tasks)
    for i, t in enumerate(sorted([*grouped[1], *grouped[2]], key=lambda t: t["startedAt"])):
        assert t["startedAt"] - ends[i] < FULL_SLICE_S + 0.1, describe(end)
    # First call to last: three 1 s waves, each refilled within a slice (the 2.2 s).
    starts = sorted(t["startedAt"] for t in tasks)
    assert starts[-1] - starts[0] < 2.2, describe(end)
