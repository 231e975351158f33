"""Named agents on a real fleet: a gateway and two workers configured with ``[[agents]]`` and
``[[bindings]]`` (as JSON in the environment). Bindings send two chats to two agents with
different models, a turn whose worker is killed resumes on the other worker as the same
agent (its model and prompt), and a scheduled job runs as the agent it names, inside that
agent's limits, while a job stored before jobs had an agent runs as ``default``, as the
scripted LLM's request log shows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_shared import keys
from fermix_shared.scheduling.store import JobStore
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, turn_calls, uniq, wait

SUPPORT_CHAT, CODER_CHAT = "support-room", "coder-room"
AGENTS = [
    {"name": "support", "model": "support-model", "system_prompt": "You are Support."},
    {"name": "coder", "model": "coder-model", "system_prompt": "You are Coder.",
     "temperature": 0.1},
    {"name": "reporter", "model": "reporter-model", "system_prompt": "You are Reporter.",
     "policy": ["read_only"], "allowed_tools": ["calculator", "current_time", "http_fetch"]},
]
BINDINGS = [
    {"agent": "support", "channel": "http", "chat": SUPPORT_CHAT},
    {"agent": "coder", "channel": "http", "chat": CODER_CHAT},
]


@pytest.fixture(scope="module")
def fleet(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_AGENTS": json.dumps(AGENTS),
           "FERMIX_BINDINGS": json.dumps(BINDINGS)}
    s = start_stack("agents", redis_url, 12, env, logs_dir, workers=2)
    yield s
    s.stop()


def calls(llm: ScriptedLLMServer, text: str) -> list[dict[str, Any]]:
    return [q for q in turn_calls(llm.script.requests) if text in json.dumps(q["body"])]


def test_bindings_send_two_chats_to_two_agents_with_their_models(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    a, b, c = uniq("support"), uniq("coder"), uniq("plain")
    llm.script.push(Reply(text="support here", match=a), Reply(text="coder here", match=b),
                    Reply(text="default here", match=c))
    with fleet.http() as http:
        runs = [start(http, a, SUPPORT_CHAT), start(http, b, CODER_CHAT),
                start(http, c, uniq("chat"))]
        assert [wait(http, run)["reply"] for run in runs] == [
            "support here", "coder here", "default here"]
    (sa,), (sb,), (sc,) = calls(llm, a), calls(llm, b), calls(llm, c)
    assert (sa["body"]["model"], sb["body"]["model"], sc["body"]["model"]) == (
        "support-model", "coder-model", "scripted-openai")
    assert sa["body"]["messages"][0]["content"].startswith("You are Support.")
    assert sb["body"]["messages"][0]["content"].startswith("You are Coder.")
    assert sb["body"]["temperature"] == 0.1 and "temperature" not in sa["body"]


def test_the_agent_is_chosen_per_message_and_kept_when_a_turn_resumes_elsewhere(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    text = uniq("resumed")
    llm.script.push(Reply(text="never delivered", delay=120, match=text),
                    Reply(text="answered after the kill", match=text))
    with fleet.http() as http:
        # The chat is bound to support; the request names coder, which wins.
        resp = http.post("/v1/agent", json={"message": text, "chatId": SUPPORT_CHAT,
                                            "agent": "coder"})
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["runId"]
        wait_until(lambda: len(calls(llm, text)) >= 1, 30, "the slow model call")
        victim = fleet.kill_holder(http, run_id)
        done = wait(http, run_id)
        assert done["status"] == "ok" and done["reply"] == "answered after the kill"
        assert http.get(f"/v1/runs/{run_id}").json()["worker"].split("@")[0] != victim.name
    first, again = calls(llm, text)
    for call in (first, again):
        assert call["body"]["model"] == "coder-model"
        assert call["body"]["messages"][0]["content"].startswith("You are Coder.")


def schedule(fleet: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", "schedule", *args],
                          env=fleet.env, capture_output=True, text=True, timeout=30)


def test_a_scheduled_job_runs_as_its_agent_and_a_job_stored_before_agents_as_default(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    # Issue 25: every run was answered by `default` (its prompt, model and full tool set).
    mine, old = uniq("reporter job"), uniq("legacy job")
    llm.script.push(Reply(text="reported", match=mine), Reply(text="legacy answered", match=old))
    added = schedule(fleet, "add", "reports", "--every", "3600", "-m", mine, "--agent", "reporter")
    assert added.returncode == 0, added.stderr
    # A record as the previous release stored it (schema_version 1, no agent).
    fleet.redis().hset(keys.sched_jobs(), "legacy", json.dumps({
        "schema_version": 1, "name": "legacy", "message": old,
        "schedule": {"kind": "every", "every_s": 3600, "tz": "UTC"},
        "delivery": {"mode": "none"}, "trust": "operator", "created_by": "cli",
        "created_at": 1_700_000_000_000}))
    store = JobStore(fleet.redis())
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda name: schedule(fleet, "run-now", name), ["reports", "legacy"]))
    assert [out.returncode for out in started] == [0, 0], [out.stderr for out in started]
    for name in ("reports", "legacy"):
        wait_until(lambda n=name: len(store.runs(n)) == 1, 30, f"the run of {name}")
    assert [(e.status, e.output) for e in (*store.runs("reports"), *store.runs("legacy"))] == [
        ("ok", "reported"), ("ok", "legacy answered")]
    (ran,), (legacy,) = calls(llm, mine), calls(llm, old)
    assert ran["body"]["model"] == "reporter-model"
    assert ran["body"]["messages"][0]["content"].startswith("You are Reporter.")
    # Its list within its policy (read_only): no http_fetch, nothing else the fleet has.
    assert sorted(t["function"]["name"] for t in ran["body"]["tools"]) == [
        "calculator", "current_time"]
    assert legacy["body"]["model"] == "scripted-openai"
    assert not legacy["body"]["messages"][0]["content"].startswith("You are Reporter.")
    assert {"http_fetch", "schedule_job"} <= {t["function"]["name"] for t in legacy["body"]["tools"]}
    with fleet.http() as http:
        jobs = {j["name"]: j["agent"] for j in http.get("/v1/status").json()["schedules"]}
    assert jobs == {"reports": "reporter", "legacy": "default"}
