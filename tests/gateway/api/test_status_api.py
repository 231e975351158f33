"""``GET /v1/status`` and ``fermix status``: queue activity, workers seen, the provider route
chain, the memory configuration and the agents' lifecycle.

The route's shape and auth are checked in-process over keys written by hand (db 11; the store's
exact numbers are in tests/shared/stores/test_status_store.py), then end to end on a real stack with
two workers (db 9), where the numbers come from the indexes the queue scripts maintain. On that
stack, an ``ops`` agent is paused with ``fermix agents pause`` and resumed over HTTP: its three
messages queue while the default agent's run, then run in order.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from fermix_dev.procs import free_port, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.memory import MemoryStore
from fermix_shared.scheduling.jobs import Delivery
from fermix_shared.scheduling.parse import make_schedule, new_job
from fermix_shared.scheduling.store import JobStore
from fermix_shared.settings import Settings
from fermix_shared.usage import budgets
from fermix_shared.usage import store as usage_store
from fermix_shared.usage.budgets import Budget
from fermix_shared.usage.periods import next_start
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import post, turn_calls, uniq, wait
from tests.seed_text import quoted

BUNDLED_DESCRIPTION = ("How to write a new Fermix skill (a SKILL.md with frontmatter and "
                       "instructions).")


@pytest.fixture
def private_db(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = redis_url.rsplit("/", 1)[0] + "/11"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.flushdb()
    r.close()


def test_status_route_shape_and_auth(private_db: tuple[str, redis.Redis], tmp_path: Path) -> None:
    url, r = private_db
    now = time.time()
    r.zadd(keys.active_index(), {"http|a|root": int((now + 30) * 1000)})
    r.zadd(keys.queued_index(), {"http|a|root": int(now * 1000)})
    r.rpush(keys.inbox("http|a|root"), "{}")
    r.hset(keys.workers(), "w1@h", str(now))
    MemoryStore(r).add("The user prefers metric units.", "tool")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "house-rules.md").write_text("Answer in English.")
    (tmp_path / "skills" / "triage").mkdir(parents=True)
    (tmp_path / "skills" / "triage" / "SKILL.md").write_text(
        "---\nname: triage\ndescription: Sort the inbox.\n---\nSort it.\n")
    broken = tmp_path / "plugins" / "p1" / "skills" / "broken"
    broken.mkdir(parents=True)
    (broken / "SKILL.md").write_text("no frontmatter")
    settings = Settings(redis_url=url, provider="anthropic", model="m-1", api_token="t0k",
                        home=tmp_path, memory_review_quiet_seconds=45,
                        memory={"recall_top": 7, "embedding_model": "text-embedding-3-small"})
    approvals.ask(r, ApprovalRequest(
        approval_id="0badc0de", conv="http|a|root", run_id="run_a", call_id="c1",
        tool="run_command", arguments={"command": "make"}, requester="http:api",
        requested_at=now, expires_at=now + 600))
    budgets.put(r, Budget(scope="agent:default", period="day", usd_micros=5_000_000,
                          set_at=now, set_by="api"))
    usage_store.record(r, ["total", "agent:default"], 1000, 500, 1_250_000, "", now)
    JobStore(r).add(new_job(name="nightly", message="m", schedule=make_schedule(every_s=60),
                            delivery=Delivery(), trust="operator", created_by="cli",
                            agent="ops"), now=int(now * 1000))

    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/status").status_code == 401
        resp = client.get("/v1/status", headers={"Authorization": "Bearer t0k"})
    assert resp.status_code == 200
    body = resp.json()
    (conv,) = body.pop("conversations")
    assert 29 <= conv.pop("leaseExpiresIn") <= 30
    assert conv == {"conversation": "http|a|root", "active": True, "pending": 1}
    (worker,) = body.pop("workers")
    assert worker["name"] == "w1@h" and 0 <= worker["lastSeenAgo"] < 5
    assert body.pop("budgets") == [{
        "scope": "agent:default", "period": "day", "limit": {"usd": 5.0, "tokens": None},
        "spent": {"usd": 1.25, "tokens": 1500}, "percent": 25.0, "reached": False,
        "resetsAt": int(next_start("day", now).timestamp() * 1000),
        "setAt": int(now * 1000), "setBy": "api",
    }]
    # Each job with the agent it runs as (issue 25).
    assert body.pop("schedules") == [{
        "name": "nightly", "agent": "ops", "trust": "operator", "schedule": "every 60s",
        "state": "active", "nextRunAt": int(now * 1000) + 60_000, "delivery": "none"}]
    # The seed's MainAgent.status names, each read from this gateway's configuration.
    assert {quoted("F", name): body.pop(name) for name in (
        "available_skills", "primary_provider", "fallback_providers")} == {
        "primary_provider": "anthropic", "fallback_providers": [],
        "available_skills": [
            {"name": "triage", "description": "Sort the inbox.", "trust": "operator",
             "root": "home"},
            {"name": "write-a-skill", "description": BUNDLED_DESCRIPTION, "trust": "operator",
             "root": "bundled"},
        ]}
    # Gateway.Queue.status/1's names too, beside the camelCase ones.
    assert {quoted("F", name): body.pop(name) for name in (
        "active_conversations", "pending_conversations", "active_requests",
        "pending_requests")} == {"active_conversations": 1, "pending_conversations": 1,
                                 "active_requests": 1, "pending_requests": 1}
    assert body.pop("model") == "m-1"  # the seed's "the current model"
    assert body.pop("memory") == {  # "and memory configuration"
        "activeFacts": 1, "maxActiveFacts": 500, "recallTop": 7, "ranking": "embeddings",
        "embeddingModel": "text-embedding-3-small",
        "filesDir": str(tmp_path / "memory"), "files": ["house-rules.md"],
        "reviewQuietSeconds": 45.0, "reviewBatchTurns": 10,
    }
    assert body == {
        "activeConversations": 1, "pendingConversations": 1,
        "activeRequests": 1, "pendingRequests": 1, "workersSeen": 1,
        "skillIssues": [{
            "source": str(broken / "SKILL.md"), "root": "plugin",
            "error": "missing YAML frontmatter (the file must start with a '---' line)",
        }],
        "skillsVersion": "0",
        # The hand-written inbox entry has no agent: it is the default agent's.
        "agents": [{"name": "default", "role": "main", "state": "active", "active": 0,
                    "pending": 1}],
        "pendingApprovals": [{
            "id": "0badc0de", "status": "pending", "tool": "run_command",
            "arguments": {"command": "make"}, "runId": "run_a", "callId": "c1",
            "conversation": "http|a|root", "requester": "http:api",
            "requestedAt": int(now * 1000), "expiresAt": int((now + 600) * 1000),
        }],
    }


ROUTES_TOML = """
[[routes]]
provider = "anthropic"
model = "claude-sonnet-4-5"

[[routes]]
provider = "openai"
model = "gpt-4.1-mini"
base_url = "http://127.0.0.1:9/v1"

[[routes]]
provider = "openai"
model = "gpt-4.1-mini"
api_key_env = "SECOND_OPENAI_KEY"
"""


def test_status_reports_the_route_chain_of_fermix_toml(
    redis_url: str, logs_dir: Path, tmp_path: Path
) -> None:
    # The primary is the first [[routes]] table, not FERMIX_PROVIDER's default; the fallbacks
    # are named as the workers name them (a repeated provider/model gets its position).
    config = tmp_path / "fermix.toml"
    config.write_text(ROUTES_TOML)
    s = start_stack("routes", redis_url, 14, {"FERMIX_CONFIG": str(config)}, logs_dir, workers=0)
    try:
        env = {**s.env, "FERMIX_GATEWAY_URL": s.url}
        raw = fermix_status(env, "--json")
        assert raw.returncode == 0, raw.stderr
        status = json.loads(raw.stdout)
        assert {k: status[k] for k in ("primary_provider", "model", "fallback_providers")} == {
            "primary_provider": "anthropic", "model": "claude-sonnet-4-5",
            "fallback_providers": ["openai/gpt-4.1-mini", "openai/gpt-4.1-mini#3"],
        }
        proc = fermix_status(env)
    finally:
        s.stop()
    assert proc.returncode == 0, proc.stderr
    assert ("primary provider: anthropic (model claude-sonnet-4-5), "
            "fallback providers: openai/gpt-4.1-mini, openai/gpt-4.1-mini#3"
            ) in proc.stdout.splitlines()


def fermix_status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", "status", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def test_fermix_status_says_when_the_gateway_is_unreachable() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc = fermix_status({**os.environ, "FERMIX_GATEWAY_URL": dead})
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"fermix: cannot reach the gateway at {dead}")


# --- end to end: a gateway and two workers (db 9) --------------------------------------------


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_AGENTS": json.dumps([{"name": "ops"}])}
    s = start_stack("status", redis_url, 9, env, logs_dir, workers=2)
    yield s
    s.stop()


def poll_status(http: httpx.Client, done: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
    """Readiness probe: the status has no event to wait on, so poll it every 50 ms."""
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = http.get("/v1/status").json()
        if done(status) or time.monotonic() >= deadline:
            return status
        time.sleep(0.05)


def test_both_workers_and_the_provider_are_reported(stack: Stack) -> None:
    with stack.http() as http:
        status = http.get("/v1/status").json()
    names = sorted(w["name"] for w in status["workers"])
    assert [n.split("@")[0] for n in names] == ["status-w1", "status-w2"]
    assert status["workersSeen"] == 2
    assert all(0 <= w["lastSeenAgo"] <= keys.WORKER_SEEN_TTL_SECONDS for w in status["workers"])
    assert (status["primary_provider"], status["model"], status["fallback_providers"]) == (
        "openai", "scripted-openai", [])
    assert (status["memory"]["recallTop"], status["memory"]["ranking"]) == (5, "full-text")
    assert status["memory"]["filesDir"] == str(Path(stack.env["FERMIX_HOME"]) / "memory")


def test_a_busy_conversation_shows_its_active_turn_and_waiting_messages(
    stack: Stack, llm: ScriptedLLMServer,
) -> None:
    token, chat = f"slow-{uuid.uuid4().hex[:10]}", f"chat-{uuid.uuid4().hex[:10]}"
    conv = f"http|{chat}|root"
    llm.script.push(Reply(text="x", delay=3, match=token))
    with stack.http() as http:
        run_ids = [
            http.post("/v1/agent", json={"message": text, "chatId": chat}).json()["runId"]
            for text in (token, f"{token}-second", f"{token}-third")
        ]

        def busy(s: dict[str, Any]) -> bool:
            mine = [c for c in s["conversations"] if c["conversation"] == conv]
            return s["activeConversations"] >= 1 and bool(mine) and mine[0]["pending"] == 2

        status = poll_status(http, busy, timeout=5)
        assert busy(status), status
        (mine,) = [c for c in status["conversations"] if c["conversation"] == conv]
        assert mine["active"] is True and 0 < mine["leaseExpiresIn"] <= 30
        assert status["pendingRequests"] == 2 and status["pendingConversations"] == 1

        for run_id in run_ids:
            waited = http.get(f"/v1/runs/{run_id}/wait", params={"timeout": 30}, timeout=40)
            assert waited.json()["status"] == "ok", waited.text

        def idle(s: dict[str, Any]) -> bool:
            return s["activeConversations"] == 0 and s["pendingRequests"] == 0

        status = poll_status(http, idle, timeout=5)
    assert idle(status), status
    assert status["pendingConversations"] == 0 and status["activeRequests"] == 0
    assert status["conversations"] == []


def test_fermix_status_prints_a_summary_or_json(stack: Stack) -> None:
    env = {**stack.env, "FERMIX_GATEWAY_URL": stack.url}
    proc = fermix_status(env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("workers seen: 2 (status-w1@")
    assert "status-w2@" in lines[0] and "s ago" in lines[0]
    assert re.fullmatch(r"active conversations: \d+, pending conversations: \d+, "
                        r"active requests: \d+, pending requests: \d+", lines[1]), lines[1]
    assert lines[2] == ("primary provider: openai (model scripted-openai), "
                        "fallback providers: none")
    home = stack.env["FERMIX_HOME"]
    assert re.fullmatch(rf"memory: \d+ of 500 facts, the top 5 by full-text in each prompt; "
                        rf"0 prompt memory files in {re.escape(home)}/memory; review after "
                        rf"30 s quiet or 10 turns", lines[3]), lines[3]
    assert lines[4:6] == ["available skills: 1",
                          f"  write-a-skill (operator): {BUNDLED_DESCRIPTION}"]

    raw = fermix_status(env, "--json")
    assert raw.returncode == 0, raw.stderr
    assert json.loads(raw.stdout)["workersSeen"] == 2


# --- agent lifecycle on the same stack --------------------------------------------------------


def start_for(http: httpx.Client, text: str, chat: str, agent: str) -> str:
    resp = post(http, text, chat, agent=agent)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["runId"])


def agent_entry(http: httpx.Client, name: str) -> dict[str, Any]:
    (entry,) = [a for a in http.get("/v1/status").json()["agents"] if a["name"] == name]
    return dict(entry)


def last_user_text(request: dict[str, Any]) -> str:
    users = [m for m in request["body"]["messages"] if m.get("role") == "user"]
    content = users[-1]["content"] if users else ""
    return content if isinstance(content, str) else json.dumps(content)


def test_a_paused_agents_three_messages_run_in_order_after_resume(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    chat = uniq("ops-chat")
    conv = f"http|{chat}|root"
    texts = [uniq(f"ops-{i}") for i in range(3)]
    cli = subprocess.run([sys.executable, "-m", "fermix_cli", "agents", "pause", "ops"],
                         env={**stack.env, "FERMIX_GATEWAY_URL": stack.url},
                         capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    r = stack.redis()
    with stack.http() as http:
        runs = [start_for(http, text, chat, "ops") for text in texts]
        # A worker took the gateway's dispatch and held the conversation, taking nothing.
        wait_until(lambda: r.hget(keys.agents_held(), conv) == "ops", 10, "the held conversation")
        other = wait(http, start_for(http, uniq("meanwhile"), uniq("chat"), "default"))
        assert other["status"] == "ok", "another agent's messages still run"
        assert [http.get(f"/v1/runs/{run}").json()["status"] for run in runs] == ["queued"] * 3
        ops = agent_entry(http, "ops")
        assert (ops["state"], ops["active"], ops["pending"]) == ("paused", 0, 3)
        assert ops["pausedAt"] > 0 and "lastActiveAt" not in ops
        assert agent_entry(http, "default")["state"] == "active"

        resumed = http.post("/v1/agents/ops/resume").json()
        assert resumed["released"] == 1 and resumed["state"] == "active"
        done = [wait(http, run) for run in runs]
        assert [d["status"] for d in done] == ["ok"] * 3
        assert [d["reply"] for d in done] == [f'Scripted reply: you said "{t}"' for t in texts]
        started = [d["startedAt"] for d in done]
        assert started == sorted(started) and done[0]["endedAt"] <= started[1]
        ops = agent_entry(http, "ops")
        assert (ops["state"], ops["active"], ops["pending"]) == ("active", 0, 0)
        assert "pausedAt" not in ops and ops["lastActiveAt"] >= done[-1]["endedAt"] - 1
    asked = [last_user_text(q) for q in turn_calls(llm.script.requests)]
    assert [t for t in asked if t in texts] == texts, "the model saw them in order, once each"
    assert r.hgetall(keys.agents_held()) == {}
