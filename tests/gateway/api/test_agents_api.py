"""``GET /v1/agents``, ``POST /v1/agents/{name}/pause|resume|kill`` and the ``agents`` of
``/v1/status``: the real app in-process on the scratch Redis, Celery recorded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.audit import AuditLog
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import queue
from fermix_shared.task_names import APPROVAL_RESUME_TASK
from tests.gateway.inprocess import DISPATCH_TASK, RecordingCelery

TOKEN = "op-t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AGENTS = [AgentDefinition(name="ops", provider="openai", model="gpt-4.1-mini"),
          AgentDefinition(name="helper", role="sub")]


@contextmanager
def gateway(url: str, agents: list[AgentDefinition] | None = None
            ) -> Iterator[tuple[TestClient, RecordingCelery]]:
    settings = Settings(redis_url=url, api_token=TOKEN, provider="anthropic", model="m-1",
                        agents=AGENTS if agents is None else agents)
    app = create_app(settings, hooks=HookRegistry())
    celery = RecordingCelery()
    app.state.tasks = celery
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, celery


def held_conversation(r: redis.Redis, chat: str, agent: str, n: int = 1) -> str:
    """A conversation with ``n`` messages for ``agent`` that a dispatch found paused."""
    key = ConversationKey(channel="http", chat_id=chat)
    for i in range(n):
        queue.accept(r, InboundMessage(key=key, text=f"m{i}", agent=agent))
    assert queue.claim(r, key.as_str(), "w1", 30)[0].kind == "paused"
    return key.as_str()


def test_every_route_needs_the_operator_token(r: redis.Redis, scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url) as (client, _):
        assert client.get("/v1/agents").status_code == 401
        assert client.post("/v1/agents/ops/pause").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.post("/v1/agents/ops/resume", headers=wrong).status_code == 401
    assert not r.exists(keys.agents_paused())


def test_list_shows_each_agent_default_first(r: redis.Redis, scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url) as (client, _):
        resp = client.get("/v1/agents", headers=AUTH)
    assert resp.status_code == 200
    assert resp.json() == {"agents": [
        {"name": "default", "role": "main", "state": "created", "active": 0, "pending": 0},
        {"name": "ops", "role": "main", "state": "created", "active": 0, "pending": 0,
         "model": "openai/gpt-4.1-mini"},
        {"name": "helper", "role": "sub", "state": "created", "active": 0, "pending": 0},
    ]}


def test_unknown_and_sub_agents_cannot_be_paused(r: redis.Redis, scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url) as (client, _):
        unknown = client.post("/v1/agents/nobody/pause", headers=AUTH)
        sub = client.post("/v1/agents/helper/pause", headers=AUTH)
        resume_unknown = client.post("/v1/agents/nobody/resume", headers=AUTH)
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "no agent named 'nobody' (agents: default, ops, helper)"
    assert resume_unknown.status_code == 404
    assert sub.status_code == 409 and "role 'sub'" in sub.json()["error"]
    assert not r.exists(keys.agents_paused())


def test_pause_is_idempotent_and_resume_dispatches_what_it_held(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with gateway(scratch_redis_url) as (client, celery):
        first = client.post("/v1/agents/ops/pause", headers=AUTH)
        assert first.status_code == 200
        body = first.json()
        paused_at = body.pop("pausedAt")
        assert body == {"name": "ops", "role": "main", "state": "paused", "active": 0,
                        "pending": 0, "model": "openai/gpt-4.1-mini"}
        assert client.post("/v1/agents/ops/pause", headers=AUTH).json()["pausedAt"] == paused_at

        a = held_conversation(r, "a", "ops", n=3)
        b = held_conversation(r, "b", "ops")
        listed = {x["name"]: x for x in client.get("/v1/agents", headers=AUTH).json()["agents"]}
        assert (listed["ops"]["state"], listed["ops"]["pending"]) == ("paused", 4)
        status = client.get("/v1/status", headers=AUTH).json()
        assert [x["name"] for x in status["agents"]] == ["default", "ops", "helper"]
        assert status["agents"][1] == listed["ops"]

        resumed = client.post("/v1/agents/ops/resume", headers=AUTH)
        assert resumed.status_code == 200
        assert resumed.json() == {"name": "ops", "role": "main", "state": "active", "active": 0,
                                  "pending": 4, "model": "openai/gpt-4.1-mini", "released": 2}
        assert sorted(x[0] for x in celery.named(DISPATCH_TASK)) == sorted([a, b])
        again = client.post("/v1/agents/ops/resume", headers=AUTH).json()
        assert again["released"] == 0 and len(celery.named(DISPATCH_TASK)) == 2
    assert not r.exists(keys.agents_paused()) and not r.exists(keys.agents_held())


def test_an_agent_no_longer_declared_can_still_be_resumed(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    r.hset(keys.agents_paused(), "retired", 1)
    conv = held_conversation(r, "c", "retired")
    with gateway(scratch_redis_url) as (client, celery):
        resp = client.post("/v1/agents/retired/resume", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["released"] == 1
    assert celery.named(DISPATCH_TASK) == [[conv]]


# --- kill ---------------------------------------------------------------------------------------


def running_turn(r: redis.Redis, chat: str, agent: str) -> str:
    """A conversation whose active turn is a message for ``agent`` (a worker holds it)."""
    key = ConversationKey(channel="http", chat_id=chat)
    queue.accept(r, InboundMessage(key=key, text="working", agent=agent))
    assert queue.claim(r, key.as_str(), "w1", 30)[0].kind == "claimed"
    return key.as_str()


def test_kill_stops_its_turns_releases_its_pause_and_is_for_good(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    busy, parked = running_turn(r, "busy", "ops"), running_turn(r, "parked", "ops")
    other = running_turn(r, "other", "default")
    now = time.time()
    approvals.ask(r, ApprovalRequest(
        approval_id="appr0001", conv=parked, run_id="run_p", call_id="call_1", tool="run_command",
        arguments={"command": "ls"}, requested_at=now, expires_at=now + 600))
    with gateway(scratch_redis_url) as (client, celery):
        assert client.post("/v1/agents/ops/pause", headers=AUTH).status_code == 200
        held = held_conversation(r, "held", "ops")
        resp = client.post("/v1/agents/ops/kill", headers=AUTH)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        killed_at = body.pop("killedAt")
        assert body.pop("lastActiveAt") <= killed_at
        assert body == {"name": "ops", "role": "main", "state": "killed", "active": 2,
                        "pending": 1, "model": "openai/gpt-4.1-mini", "stopped": 2,
                        "released": 1}
        # Its running turns are cancelled (their workers wind down and their subagents stop);
        # the one parked on an approval has no worker to notice: its approval is cancelled
        # and its turn resumed, to end now. The held conversation is dispatched again, so its
        # message gets the refusal. Another agent's turn runs on.
        assert r.hget(keys.active(busy), "cancelled") == "killed"
        assert r.hget(keys.active(parked), "cancelled") == "killed"
        assert not r.hexists(keys.active(other), "cancelled")
        assert celery.named(APPROVAL_RESUME_TASK) == [["appr0001"]]
        assert celery.named(DISPATCH_TASK) == [[held]]

        listed = {x["name"]: x for x in client.get("/v1/agents", headers=AUTH).json()["agents"]}
        assert (listed["ops"]["state"], listed["ops"]["killedAt"]) == ("killed", killed_at)
        assert "pausedAt" not in listed["ops"]
        # Pause and resume cannot bring it back; killing it again changes nothing.
        for verb in ("pause", "resume"):
            refused = client.post(f"/v1/agents/ops/{verb}", headers=AUTH)
            assert refused.status_code == 409
            assert refused.json()["error"] == (
                "agent 'ops' was killed: it takes no turns until its definition is re-created "
                "(declared again with a change)")
        again = client.post("/v1/agents/ops/kill", headers=AUTH).json()
        assert (again["killedAt"], again["stopped"], again["released"]) == (killed_at, 0, 0)
        assert client.post("/v1/agents/helper/kill", headers=AUTH).status_code == 409
        assert client.post("/v1/agents/nobody/kill", headers=AUTH).status_code == 404
    assert not r.exists(keys.agents_paused())
    kills = [e for e in AuditLog(r).recent(limit=50) if e.action == "agent.kill"]
    assert [(e.kind, e.outcome, e.actor, e.agent, e.detail["again"], e.detail["stopped"],
             e.detail["released"]) for e in reversed(kills)] == [
        ("agent", "ok", "http:api", "ops", False, 2, 1), ("agent", "ok", "http:api", "ops", True, 0, 0)]


def test_a_re_created_definition_is_a_new_agent(r: redis.Redis, scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url) as (client, _):
        assert client.post("/v1/agents/ops/kill", headers=AUTH).status_code == 200
    # The same definition after a restart: still killed.
    with gateway(scratch_redis_url) as (client, _):
        assert client.post("/v1/agents/ops/pause", headers=AUTH).status_code == 409
    # Declared again with a change (here its model): the kill no longer applies to it.
    reborn = [AgentDefinition(name="ops", provider="openai", model="gpt-4.1"), AGENTS[1]]
    with gateway(scratch_redis_url, reborn) as (client, _):
        listed = {x["name"]: x for x in client.get("/v1/agents", headers=AUTH).json()["agents"]}
        assert listed["ops"]["state"] == "created" and "killedAt" not in listed["ops"]
        assert client.post("/v1/agents/ops/pause", headers=AUTH).json()["state"] == "paused"
