"""Numbers and types at the edges (issue 25, item 12): every ``/v1`` route refuses a bad body
with one shape, ``{"error": "<field>: <reason>"}`` (the OpenAI-compatible routes keep OpenAI's
``{"error": {"message", ...}}``), takes JSON types strictly (``true`` is no count, ``"5"`` no
amount) and bounds its numbers: ``usd: 1e303`` was a 500 (an overflow), ``tokens: true`` and
``usd: "5"`` were accepted, and a 404 or 401 came as ``{"detail": ...}``.

The real app in-process on a real Redis, with an API token set.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.gateway.inprocess import RecordingCelery

TOKEN = "edge-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DAY = {"scope": "agent:default", "period": "day"}


@pytest.fixture
def client(r: redis.Redis, scratch_redis_url: str) -> Iterator[TestClient]:
    app = create_app(Settings(redis_url=scratch_redis_url, api_token=TOKEN), hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


BAD_BODIES: list[tuple[str, str, dict[str, Any], str]] = [
    ("PUT", "/v1/budgets", {**DAY, "usd": 1e303}, "usd: Input should be less than or equal to 1000000000"),
    ("PUT", "/v1/budgets", {**DAY, "usd": "5"}, "usd: Input should be a valid number"),
    ("PUT", "/v1/budgets", {**DAY, "tokens": True}, "tokens: Input should be a valid integer"),
    ("PUT", "/v1/budgets", {**DAY, "tokens": 10**16}, "tokens: Input should be less than or equal to 1000000000000000"),
    ("PUT", "/v1/budgets", {**DAY, "tokens": 1.5}, "tokens: Input should be a valid integer"),
    ("PUT", "/v1/budgets", {**DAY, "usd": 0}, "usd: Input should be greater than 0"),
    ("PUT", "/v1/budgets", {**DAY, "scope": 7, "usd": 1}, "scope: Input should be a valid string"),
    ("PUT", "/v1/budgets", DAY, "a budget needs a limit: usd, tokens or both"),
    ("PUT", "/v1/budgets", {**DAY, "scope": "team:x", "usd": 1}, "scope: unknown scope kind 'team'"),
    ("POST", "/v1/agent", {"message": "hi", "chatId": True}, "chatId: Value error, must be a string or an integer"),
    ("POST", "/v1/agent", {"message": "hi", "chatId": 1.5}, "chatId: Value error, must be a string or an integer"),
    ("POST", "/v1/agent", {"message": 5}, "message: Input should be a valid string"),
    ("POST", "/v1/agent", {"message": "hi", "messageId": 42}, "messageId: Input should be a valid string"),
    ("POST", "/v1/agent", {"message": "hi", "profile": True}, "profile: Input should be 'default' or 'ultra'"),
    ("POST", "/v1/approvals/abcd1234", {"decision": True}, "decision: Input should be 'approve' or 'deny'"),
    ("POST", "/v1/approvals/abcd1234", {"decision": "deny", "reason": 5}, "reason: Input should be a valid string"),
]


@pytest.mark.parametrize(("method", "path", "body", "error"), BAD_BODIES)
def test_a_bad_body_is_a_422_with_one_error_shape(
    client: TestClient, method: str, path: str, body: dict[str, Any], error: str
) -> None:
    resp = client.request(method, path, json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert list(resp.json()) == ["error"] and resp.json()["error"].startswith(error), resp.text


@pytest.mark.parametrize(("method", "path", "params", "status", "error"), [
    ("GET", "/v1/runs/run_nope", {}, 404, "no run 'run_nope'"),
    ("GET", "/v1/runs/run_nope/wait", {"timeout": "1e400"}, 422, "timeout: Input should be less than or equal to 3600"),
    ("GET", "/v1/approvals/abcd1234", {}, 404, "no approval 'abcd1234'"),
    ("POST", "/v1/agents/nobody/pause", {}, 404, "no agent named 'nobody'"),
    ("DELETE", "/v1/budgets", DAY, 404, "no daily budget on agent:default"),
    ("GET", "/v1/usage", {"by": "hour", "last": 10**30}, 422, "last: at most 72 hours are kept"),
    ("GET", "/v1/audit/recent", {"limit": 0}, 422, "limit: Input should be greater than or equal to 1"),
    ("GET", "/v1/nothing-here", {}, 404, "Not Found"),
])
def test_every_refusal_has_the_same_shape(
    client: TestClient, method: str, path: str, params: dict[str, Any], status: int, error: str
) -> None:
    resp = client.request(method, path, params=params, headers=AUTH)
    assert resp.status_code == status, resp.text
    assert list(resp.json()) == ["error"] and resp.json()["error"].startswith(error), resp.text


def test_a_missing_token_is_refused_in_the_same_shape(client: TestClient) -> None:
    resp = client.get("/v1/status")
    assert (resp.status_code, resp.json()) == (401, {
        "error": "missing bearer token (Authorization: Bearer <FERMIX_API_TOKEN>)"})
    assert resp.headers["www-authenticate"] == "Bearer"
    wrong = client.get("/v1/status", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()) == (401, {"error": "invalid bearer token"})


def test_a_budget_at_the_bounds_is_taken(client: TestClient) -> None:
    resp = client.put("/v1/budgets", headers=AUTH,
                      json={**DAY, "usd": 1_000_000_000, "tokens": 10**15})
    assert resp.status_code == 200, resp.text
    assert resp.json()["limit"] == {"usd": 1e9, "tokens": 10**15}


@pytest.mark.parametrize(("body", "param"), [
    ({"stream": "true"}, "stream"),
    ({"user": 5}, "user"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
])
def test_the_openai_routes_refuse_loose_types_in_openais_shape(
    client: TestClient, body: dict[str, Any], param: str
) -> None:
    full = {"model": "fermix/default", "messages": [{"role": "user", "content": "hi"}], **body}
    resp = client.post("/v1/chat/completions", json=full, headers=AUTH)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"].startswith(param), err
