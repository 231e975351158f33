"""Skills across a fleet: two real workers with different FERMIX_HOME disks (two hosts) on one
Redis. A skill created through ``skill_create`` on a turn one worker runs is in the other
worker's next prompt, in its ``skill_list`` and runs through its ``skill_run``, without a
restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.models import RunRecord
from fermix_shared.stores import runs
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, start, turn_calls, uniq, wait

WORKERS = {"skills-w1", "skills-w2"}
# Each worker holds at most 2 turns (prefetch 1), so 5 slow turns at once reach both.
CONCURRENCY = 2
BATCH = 5


@pytest.fixture(scope="module")
def hosts(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("skills", redis_url, 2, provider_env(llm, "openai"), logs_dir, workers=0)
    try:
        for name in ("skills-w1", "skills-w2"):
            s.env = {**s.env, "FERMIX_HOME": str(logs_dir / name)}
            s.start_worker(name, concurrency=CONCURRENCY)
    except Exception:
        s.stop()
        raise
    yield s
    s.stop()


def run_turns(stack: Stack, http: httpx.Client, llm: ScriptedLLMServer, texts: list[str],
              *replies: Reply) -> list[RunRecord]:
    """Start a turn per text at once (slow replies unless ``replies``), wait for them all."""
    llm.script.push(*(replies or [Reply(text="ok", delay=1.0, match=t) for t in texts]))
    run_ids = [start(http, t, uniq("chat")) for t in texts]
    records = []
    for run_id in run_ids:
        assert wait(http, run_id)["status"] == "ok"
        record = runs.get(stack.redis(), run_id)
        assert record is not None and record.worker is not None
        records.append(record)
    return records


def node(record: RunRecord) -> str:
    assert record.worker is not None
    return record.worker.split("@", 1)[0]


def system_of(llm: ScriptedLLMServer, text: str) -> str:
    (first, *_) = [r for r in turn_calls(llm.script.requests) if text in json.dumps(r["body"])]
    return str(first["body"]["messages"][0]["content"])


def test_a_skill_created_on_one_worker_is_in_the_other_workers_next_prompt(
    hosts: Stack, llm: ScriptedLLMServer, logs_dir: Path
) -> None:
    with hosts.http() as http:
        # Both workers have run a turn (and so hold a registry snapshot) before the skill exists.
        warm = run_turns(hosts, http, llm, [uniq("warm") for _ in range(BATCH)])
        assert {node(rec) for rec in warm} == WORKERS
        create = uniq("create")
        (made,) = run_turns(hosts, http, llm, [create], Reply(tool_calls=[ToolCallSpec(
            "skill_create", {"name": "fleet-digest", "description": "Summarise the fleet's day.",
                             "instructions": "1. Collect.\n2. Summarise."},
        )], match=create), Reply(text="created", match=create))
        creator = node(made)
        (other,) = WORKERS - {creator}
        assert "fleet-digest" not in system_of(llm, create)

        texts = [uniq("after") for _ in range(BATCH)]
        ran = dict(zip(texts, map(node, run_turns(hosts, http, llm, texts)), strict=True))
    on_other = [t for t in texts if ran[t] == other]
    assert on_other, ran
    for text in texts:  # every later turn, on either host, lists it
        assert "- fleet-digest: Summarise the fleet's day." in system_of(llm, text)
    # Only the creating host's disk has the file; the other worker read it from Redis.
    assert (logs_dir / creator / "skills" / "fleet-digest" / "SKILL.md").is_file()
    assert not (logs_dir / other / "skills" / "fleet-digest").exists()


def last_user(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]["content"]) if users else ""


def requests_of(llm: ScriptedLLMServer, text: str) -> list[dict[str, Any]]:
    """The model calls of the turn (or skill run) whose user message is ``text``."""
    return [r["body"] for r in turn_calls(llm.script.requests) if last_user(r["body"]) == text]


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


BRIEF = "Reply with one line: BRIEF, then the task."


def test_a_skill_created_on_one_worker_is_listed_and_run_on_the_other(
    hosts: Stack, llm: ScriptedLLMServer
) -> None:
    listing = ToolCallSpec("skill_list", {})
    with hosts.http() as http:
        # Every worker lists the skills (and so holds a snapshot) before this one exists.
        before = [uniq("list") for _ in range(BATCH)]
        listed = run_turns(hosts, http, llm, before, *[x for t in before for x in (
            Reply(tool_calls=[listing], delay=1.0, match=t), Reply(text="listed", match=t))])
        assert {node(rec) for rec in listed} == WORKERS
        assert all("fleet-brief" not in requests_of(llm, t)[-1]["messages"][-1]["content"]
                   for t in before)
        # Running it before it exists is refused (the chord's callback brings the error).
        create = uniq("create")
        (made,) = run_turns(hosts, http, llm, [create], Reply(tool_calls=[ToolCallSpec(
            "skill_run", {"name": "fleet-brief", "task": "too early"})], match=create),
            Reply(tool_calls=[ToolCallSpec("skill_create", {
                "name": "fleet-brief", "description": "Brief the fleet.", "instructions": BRIEF,
            })], match=create), Reply(text="created", match=create))
        assert tool_results(requests_of(llm, create)[-1]) == [
            "Error: no skill named 'fleet-brief'; skill_list shows the available ones",
            "Created skill 'fleet-brief'; every worker uses it from its next turn."]
        creator = node(made)  # skill_create ran after the resume, where the record ends
        (other,) = WORKERS - {creator}

        # Turns on both workers list the skill and run it: the parent parks while it runs.
        texts = [uniq("after") for _ in range(BATCH)]
        tasks = {t: uniq("brief") for t in texts}
        for t in texts:
            llm.script.push(
                Reply(tool_calls=[listing, ToolCallSpec(
                    "skill_run", {"name": "fleet-brief", "task": tasks[t]})], delay=1.0, match=t),
                Reply(text=f"BRIEF {tasks[t]}", delay=1.0, match=tasks[t]),
                Reply(text=f"done {t}", match=t))
        run_ids = {t: start(http, t, uniq("chat")) for t in texts}
        # While a skill runs (its model answers after 1 s), the parent's record still names
        # the worker that listed the skill and launched the run.
        launcher: dict[str, str] = {}
        while len(launcher) < len(texts):
            assert llm.script.wait_request(lambda q: any(
                last_user(q["body"]) == tasks[t] for t in texts if t not in launcher), 30)
            for t in texts:
                if t not in launcher and requests_of(llm, tasks[t]):
                    record = runs.get(hosts.redis(), run_ids[t])
                    assert record is not None
                    launcher[t] = node(record)
        ran: dict[str, str] = {}
        for t in texts:
            run = wait(http, run_ids[t])
            assert run["status"] == "ok" and run["reply"] == f"done {t}"
            (end,) = [d for e, d in events(http, run_ids[t])
                      if e == "diagnostic" and d.get("kind") == "skill" and d["phase"] == "end"]
            assert (end["name"], end["status"]) == ("fleet-brief", "completed")
            ran[t] = end["worker"].split("@", 1)[0]
    print("launched on:", launcher, "ran on:", ran)
    assert any(launcher[t] == other for t in texts), launcher
    assert set(ran.values()) <= WORKERS
    for t in texts:
        # The skill's instructions were the run's system prompt, its task the user message...
        (skill_call,) = requests_of(llm, tasks[t])
        assert str(skill_call["messages"][0]["content"]).startswith(f"{BRIEF}\n\n")
        # ... and its answer came back to the parent as the call's result.
        listed_now, answer = tool_results(requests_of(llm, t)[-1])
        assert "fleet-brief (operator, created): Brief the fleet." in listed_now
        assert answer == f"BRIEF {tasks[t]}"
