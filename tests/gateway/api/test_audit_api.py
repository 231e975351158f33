"""``GET /v1/audit/recent`` and what the gateway audits: trust decisions on inbound messages
(HTTP token holders, owners, guests, dropped strangers), owner-only refusals, admin commands,
agent pause/resume and approval decisions. The real app in-process on the scratch Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import audit
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.audit import AuditLog
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.gateway.inprocess import TG_SECRET, RecordingCelery, telegram_headers, tg_update
from tests.seed_text import quoted

TOKEN = "op-t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OWNER, GUEST, STRANGER = 111, 222, 999


@contextmanager
def gateway(url: str) -> Iterator[TestClient]:
    settings = Settings(redis_url=url, api_token=TOKEN, provider="anthropic", model="m-1",
                        telegram_webhook_secret=TG_SECRET, telegram_bot_username="fermix_test_bot",
                        owner_ids=[f"telegram:{OWNER}"], allowed_ids=[f"telegram:{GUEST}"],
                        agents=[AgentDefinition(name="ops")])
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def recent(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    resp = client.get("/v1/audit/recent", params=params, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["entries"])


def telegram(client: TestClient, update_id: int, text: str, user: int) -> None:
    resp = client.post("/webhooks/telegram", json=tg_update(update_id, text, chat=user, user=user),
                       headers=telegram_headers())
    assert resp.status_code == 200


def test_the_route_needs_the_operator_token_and_bounds_its_limit(
        r: redis.Redis, scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url) as client:
        assert client.get("/v1/audit/recent").status_code == 401
        assert client.get("/v1/audit/recent", headers={"Authorization": "Bearer no"}
                          ).status_code == 401
        for bad in ("0", "1001", "x"):
            assert client.get("/v1/audit/recent", params={"limit": bad},
                              headers=AUTH).status_code == 422
        body = client.get("/v1/audit/recent", headers=AUTH).json()
    assert body == {"entries": [], "head": None, "anchor": {"seq": 0, "hash": audit.GENESIS}}


def test_inbound_trust_decisions_commands_and_refusals_newest_first(
        r: redis.Redis, scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url) as client:
        assert client.post("/v1/agent", json={"message": "hello password=hunter2",
                                              "chatId": "c1"}, headers=AUTH).status_code == 202
        telegram(client, 1, "let me in", STRANGER)
        telegram(client, 2, "/ultra do it all", GUEST)
        telegram(client, 3, "/stop", OWNER)
        assert client.post("/v1/agent", json={"message": "/queue collect", "chatId": "c1"},
                           headers=AUTH).status_code == 202
        got = recent(client)
        body = client.get("/v1/audit/recent", headers=AUTH).json()
        assert [e["seq"] for e in recent(client, limit=2)] == [9, 8]
        assert [e["action"] for e in recent(client, agent="ops")] == []
    # An owner-only command's check is an entry whether it passes (/queue) or fails (/ultra).
    assert [(e["kind"], e["action"], e["outcome"], e["actor"]) for e in got] == [
        ("admin", "/queue", "ok", "http:api"),
        ("check", "/queue", "pass", "http:api"),
        ("trust", "inbound", "pass", "http:api"),
        ("admin", "/stop", "ok", f"telegram:{OWNER}"),
        ("trust", "inbound", "pass", f"telegram:{OWNER}"),
        ("check", "/ultra", "fail", f"telegram:{GUEST}"),
        ("trust", "inbound", "pass", f"telegram:{GUEST}"),
        ("trust", "inbound", "fail", f"telegram:{STRANGER}"),
        ("trust", "inbound", "pass", "http:api"),
    ]
    first = got[-1]
    assert set(first) == {"schema_version", "seq", "ts", "prev", "hash", "kind", "action",
                          "outcome", "actor", "run", "conv", "agent", "detail"}
    assert first["conv"] == "http|c1|root" and first["agent"] == "default"
    assert first["detail"] == {"trust": "operator", "text_len": 22,
                               "text_sha256": audit.text_digest("hello password=hunter2")}
    assert got[-2]["detail"]["trust"] == "stranger"
    assert got[4]["detail"]["trust"] == "operator" and got[6]["detail"]["trust"] == "guest"
    assert got[1]["detail"] == {"check": "owner_only", "trust": "operator"}
    assert body["head"]["seq"] == 9 and body["head"]["hash"] == got[0]["hash"]
    assert "hunter2" not in str(r.hgetall("fx:{audit}:entries"))
    assert AuditLog(r).verify().ok


def test_pause_resume_and_an_approval_decision(r: redis.Redis, scratch_redis_url: str) -> None:
    now = time.time()
    approvals.ask(r, ApprovalRequest(
        approval_id="abcd1234", conv="http|c9|root", run_id="run_9", call_id="call_1",
        tool="run_command", arguments={"command": "rm -rf /tmp/x"}, requested_at=now,
        expires_at=now + 600))
    with gateway(scratch_redis_url) as client:
        assert client.post("/v1/agents/ops/pause", headers=AUTH).status_code == 200
        assert client.post("/v1/agents/ops/resume", headers=AUTH).status_code == 200
        assert client.post("/v1/approvals/abcd1234", json={"decision": "deny", "reason": "no"},
                           headers=AUTH).status_code == 200
        got = recent(client)
        ops = recent(client, agent="ops")
        # OpenFang's spelling: GET /api/audit/recent?agent_id=
        assert quoted("O", "curl http://localhost:4200/api/audit/recent?agent_id=")
        assert recent(client, agent_id="ops") == ops
        clash = client.get("/v1/audit/recent", params={"agent": "ops", "agent_id": "dev"},
                           headers=AUTH)
        assert clash.status_code == 400 and "different agents" in clash.text
        run9 = recent(client, run="run_9")
    assert [(e["kind"], e["action"], e["actor"]) for e in got] == [
        ("approval", "denied", "http:api"), ("agent", "agent.resume", "http:api"),
        ("agent", "agent.pause", "http:api")]
    assert [e["action"] for e in ops] == ["agent.resume", "agent.pause"]
    assert ops[0]["detail"] == {"was_paused": True, "released": 0}
    (denied,) = run9
    assert denied["conv"] == "http|c9|root"
    assert denied["detail"] == {"approval_id": "abcd1234", "tool": "run_command",
                                "call_id": "call_1", "reason_sha256": audit.text_digest("no")}
    assert "rm -rf" not in str(r.hgetall("fx:{audit}:entries"))
