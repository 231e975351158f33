"""Which agent a message goes to, decided when the gateway accepts it: ``agent`` on
``POST /v1/agent``, else the most specific binding, else ``default``. The choice is stored
with the queued message (what every worker, and a resumed turn, reads)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.fleet import uniq
from tests.gateway.inprocess import (
    TG_OWNER,
    RecordingCelery,
    settings_for,
    telegram_headers,
    tg_update,
)

AGENTS = [{"name": "ops", "model": "ops-model"}, {"name": "coder"},
          {"name": "worker-bee", "role": "sub"}]


@contextmanager
def gateway_with_agents(redis_url: str, bindings: list[dict[str, object]]
                        ) -> Iterator[TestClient]:
    base = settings_for(redis_url)
    settings = Settings(**{**base.model_dump(), "agents": AGENTS, "bindings": bindings})
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def queued_agents(r: redis.Redis, conv: str) -> list[str]:
    return [json.loads(m)["agent"] for m in r.lrange(keys.inbox(conv), 0, -1)]


def test_the_request_names_the_agent_else_the_bindings_choose(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    bound, free = uniq("bound"), uniq("free")
    with gateway_with_agents(scratch_redis_url, [
        {"agent": "ops", "channel": "http", "chat": bound},
    ]) as client:
        for body in ({"message": "a", "chatId": bound},
                     {"message": "b", "chatId": bound, "agent": "coder"},
                     {"message": "c", "chatId": free},
                     {"message": "d", "chatId": free, "agent": "ops"}):
            resp = client.post("/v1/agent", json=body)
            assert resp.status_code == 202, resp.text
    assert queued_agents(r, f"http|{bound}|root") == ["ops", "coder"]
    assert queued_agents(r, f"http|{free}|root") == ["default", "ops"]


def test_an_unknown_or_sub_agent_is_refused_with_a_reason(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    chat = uniq("chat")
    with gateway_with_agents(scratch_redis_url, []) as client:
        unknown = client.post("/v1/agent", json={"message": "x", "chatId": chat, "agent": "nope"})
        sub = client.post("/v1/agent", json={"message": "x", "chatId": chat,
                                             "agent": "worker-bee"})
        bad = client.post("/v1/agent", json={"message": "x", "chatId": chat, "agent": ""})
    assert unknown.status_code == 422
    assert unknown.json()["error"] == ("agent: no agent named 'nope'; declared agents: "
                                       "default, ops, coder, worker-bee")
    assert sub.status_code == 422 and "'sub' agent" in sub.json()["error"]
    assert bad.status_code == 422
    assert r.llen(keys.inbox(f"http|{chat}|root")) == 0


def test_a_chat_message_gets_the_agent_its_binding_names(
    r: redis.Redis, scratch_redis_url: str
) -> None:
    with gateway_with_agents(scratch_redis_url, [
        {"agent": "coder", "channel": "telegram", "chat": TG_OWNER},
    ]) as client:
        resp = client.post("/webhooks/telegram", headers=telegram_headers(),
                           content=json.dumps(tg_update(91001, "hello")))
        assert resp.status_code == 200
    assert queued_agents(r, f"telegram|{TG_OWNER}|root")[-1] == "coder"
