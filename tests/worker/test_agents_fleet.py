"""Named agents on a real fleet: a gateway and two workers configured with ``[[agents]]`` and
``[[bindings]]`` (as JSON in the environment). Bindings send two chats to two agents with
different models, a turn whose worker is killed resumes on the other worker as the same
agent (its model and prompt), and a scheduled job runs as the agent it names, inside that
agent's limits, while a job stored before jobs had an agent runs as ``default``, as the
scripted LLM's request log shows. Killing an agent stops its running turn and its fan-out's
subagents at once and refuses its messages, queued or new, with a reply."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.agents.lifecycle import KILLED_NOTICE, KILLED_REPLY
from fermix_shared.scheduling.store import JobStore
from fermix_worker.subagents.watch import KILLED_PARENT
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, start, turn_calls, uniq, wait

SUPPORT_CHAT, CODER_CHAT = "support-room", "coder-room"
AGENTS = [
    {"name": "support", "model": "support-model", "system_prompt": "You are Support."},
    {"name": "coder", "model": "coder-model", "system_prompt": "You are Coder.",
     "temperature": 0.1},
    {"name": "reporter", "model": "reporter-model", "system_prompt": "You are Reporter.",
     "policy": ["read_only"], "allowed_tools": ["calculator", "current_time", "http_fetch"]},
    # Killed by the last test (for good: nothing else here uses it).
    {"name": "doomed", "system_prompt": "You are Doomed."},
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


def run_as(http: Any, text: str, chat: str, agent: str) -> str:
    resp = http.post("/v1/agent", json={"message": text, "chatId": chat, "agent": agent})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["runId"])


def test_kill_stops_the_agents_turns_and_subagents_and_refuses_its_messages(
    fleet: Stack, llm: ScriptedLLMServer
) -> None:
    slow, fan, behind = uniq("slow"), uniq("fan out"), uniq("queued behind")
    tasks = [uniq("sub0"), uniq("sub1")]
    plain = uniq("default still answers")
    llm.script.push(
        Reply(text="never delivered", delay=60, match=slow),
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks})], match=fan),
        *[Reply(text="never", delay=60, match=t) for t in tasks],
        Reply(text="default here", match=plain))
    slow_chat, fan_chat = uniq("chat"), uniq("chat")
    r = fleet.redis()
    with fleet.http() as http:
        slow_run = run_as(http, slow, slow_chat, "doomed")
        fan_run = run_as(http, fan, fan_chat, "doomed")
        behind_run = run_as(http, behind, slow_chat, "doomed")
        wait_until(lambda: len(calls(llm, slow)) == 1 and sum(
            len(calls(llm, t)) for t in tasks) == 2, 30, "the slow call and both subagents")
        killed_at = time.monotonic()
        resp = http.post("/v1/agents/doomed/kill")
        assert resp.status_code == 200, resp.text
        assert (resp.json()["state"], resp.json()["stopped"]) == ("killed", 2)
        ended = [wait(http, run, timeout=20) for run in (slow_run, fan_run, behind_run)]
        took = time.monotonic() - killed_at
        after = wait(http, run_as(http, uniq("after the kill"), uniq("chat"), "doomed"))
        other = wait(http, start(http, plain, uniq("chat")))
        agents = {a["name"]: a["state"] for a in http.get("/v1/agents").json()["agents"]}
        fanned = [d for e, d in events(http, fan_run)
                  if e == "diagnostic" and d.get("kind") == "subagents" and d.get("phase") == "end"]
    notice, reply = (KILLED_NOTICE.format(agent="doomed"), KILLED_REPLY.format(agent="doomed"))
    # The running turn (a silent 60 s model call) and the fan-out's parked turn stop at once;
    # the fan-out's two subagents are cancelled with them (the kill cascades to children).
    assert [(e["status"], e.get("error")) for e in ended[:2]] == [("stopped", notice)] * 2
    assert took < 10, f"the kill took {took:.1f} s to stop the turns"
    (end,) = fanned
    assert [t["status"] for t in end["tasks"]] == ["cancelled", "cancelled"]
    # The message queued behind the running turn, and one sent after the kill, get the refusal.
    assert [(e["status"], e.get("error")) for e in (ended[2], after)] == [("error", reply)] * 2
    assert calls(llm, behind) == [] and len(calls(llm, slow)) == 1
    assert (other["status"], other["reply"]) == ("ok", "default here")
    assert agents["doomed"] == "killed" and agents["default"] != "killed"
    trail = [(e["kind"], e["action"], e["outcome"], e["detail"].get("reason"))
             for e in map(json.loads, r.hvals(keys.audit_entries()))
             if e["agent"] == "doomed" or e["run"] == fan_run]
    assert ("agent", "subagents.spawn", "ok", None) in trail
    assert ("check", "subagents", "pass", None) in trail
    assert ("agent", "agent.kill", "ok", None) in trail
    assert trail.count(("agent", "subagent.cancel", "ok", KILLED_PARENT)) == 2
    assert sum(1 for e in trail if e[:3] == ("check", "agent.killed", "fail")) == 2
