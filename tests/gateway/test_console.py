"""The console's sign-in and session rules on the gateway in this process (TestClient) over a
private Redis; the pages themselves are tested in a real browser (tests/console/)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared.settings import Settings

TOKEN = "console-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def url(scratch_redis_url: str) -> str:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(redis_url=url, api_token=TOKEN))) as c:
        yield c


def sign_in(client: TestClient, token: str) -> str:
    resp = client.post("/console/login", data={"token": token}, follow_redirects=False)
    assert (resp.status_code, resp.headers["location"]) == (303, "/console"), resp.text
    cookie = resp.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=43200" in cookie
    page = client.get("/console/approvals")
    assert page.status_code == 200
    return page.text.split('name="csrf-token" content="')[1].split('"')[0]


def test_pages_need_a_session_and_carry_a_strict_content_security_policy(
    client: TestClient
) -> None:
    resp = client.get("/console/agents", follow_redirects=False)
    assert (resp.status_code, resp.headers["location"]) == (303, "/console/login")
    login = client.get("/console/login")
    assert login.headers["content-security-policy"].startswith("default-src 'self';")
    assert login.headers["x-frame-options"] == "DENY"
    assert "<script" not in login.text.replace('<script src="/console/static/console.js" defer>', "")
    bad = client.post("/console/login", data={"token": "nope"})
    assert bad.status_code == 401 and "That token is not valid here" in bad.text
    foreign = client.post("/console/login", data={"token": TOKEN},
                          headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403
    static = client.get("/console/static/console.js")
    assert static.status_code == 200 and "X-CSRF-Token" in static.text


def test_a_session_acts_with_its_tokens_role_needs_its_csrf_token_and_ends_with_the_token(
    client: TestClient
) -> None:
    made = client.post("/v1/tokens", json={"name": "olga", "role": "operator"}, headers=ADMIN)
    csrf = sign_in(client, made.json()["token"])
    assert client.get("/v1/status").status_code == 200  # the cookie reads
    body = {"scope": "total", "period": "day", "usd": 1}
    assert client.put("/v1/budgets", json=body).json()["error"] == (
        "missing or wrong CSRF token (X-CSRF-Token)")
    refused = client.put("/v1/budgets", json=body, headers={"X-CSRF-Token": csrf})
    assert refused.json()["error"] == "this needs the admin role; the token 'olga' is an operator"
    assert client.put("/v1/budgets", json=body, headers={
        "X-CSRF-Token": csrf, "Origin": "https://evil.example"}).status_code == 403
    # Revoking the token ends its sessions at once.
    assert client.delete("/v1/tokens/olga", headers=ADMIN).status_code == 200
    assert client.get("/v1/status").status_code == 401
    assert client.get("/console/agents", follow_redirects=False).status_code == 303


def test_signing_out_ends_the_session(client: TestClient) -> None:
    csrf = sign_in(client, TOKEN)
    assert client.post("/console/logout", follow_redirects=False).status_code == 403
    out = client.post("/console/logout", headers={"X-CSRF-Token": csrf}, follow_redirects=False)
    assert out.status_code == 303
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_fermix_console_off_leaves_the_console_out(url: str) -> None:
    with TestClient(create_app(Settings(redis_url=url, api_token=TOKEN, console=False))) as c:
        assert c.get("/console/login").status_code == 404
        assert c.get("/console/static/console.js").status_code == 404
