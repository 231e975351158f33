"""Named API tokens with roles, on the gateway in this process (TestClient) over a private Redis:
an admin makes a token and sees it once; every ``/v1`` route checks the caller's role (403
naming the role needed); a revoked token stops at once; every change is audited with the
token's name; and without ``FERMIX_API_TOKEN`` the API stays open (development)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.audit.store import AuditLog
from fermix_shared.settings import Settings

TOKEN = "env-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/6"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.close()


@pytest.fixture
def client(db: tuple[str, redis.Redis]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(redis_url=db[0], api_token=TOKEN))) as c:
        yield c


def make(client: TestClient, name: str, role: str) -> dict[str, str]:
    resp = client.post("/v1/tokens", json={"name": name, "role": role}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def routes(client: TestClient) -> list[tuple[str, str]]:
    """Every ``/v1`` route as (method, path with its parameters filled in)."""
    out = []
    for path, methods in client.app.openapi()["paths"].items():  # type: ignore[attr-defined]
        if path.startswith("/v1/"):
            path = path.replace("{model}", "m").replace("{run_id}", "run_x")
            path = path.replace("{name}", "x").replace("{approval_id}", "ap_x")
            out += [(m.upper(), path) for m in methods]
    return sorted(out)


def reason(resp: httpx.Response) -> str:
    """The refusal's sentence: ``error``, or OpenAI's ``error.message`` on its routes."""
    error = resp.json()["error"]
    return str(error if isinstance(error, str) else error["message"])


def test_an_admin_makes_a_token_shown_once_and_lists_it_by_name_and_hint(
    client: TestClient, db: tuple[str, redis.Redis]
) -> None:
    resp = client.post("/v1/tokens", json={"name": "ann", "role": "operator"}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    made = resp.json()
    secret = made["token"]
    assert secret.startswith("fxt_") and len(secret) == 47
    assert (made["name"], made["role"], made["createdBy"], made["hint"]) == (
        "ann", "operator", "api", f"…{secret[-4:]}")
    listed = client.get("/v1/tokens", headers=ADMIN).json()["tokens"]
    assert [(t["name"], t["role"], t["hint"]) for t in listed] == [
        ("ann", "operator", f"…{secret[-4:]}")]
    assert "token" not in listed[0]
    # Stored hashed: the secret is nowhere in Redis.
    r = db[1]
    stored = [*r.hgetall(keys.api_tokens()).items(), *r.hgetall(keys.api_token_names()).items()]
    assert stored and not [kv for kv in stored if secret in kv[0] or secret in kv[1]]

    again = client.post("/v1/tokens", json={"name": "ann", "role": "viewer"}, headers=ADMIN)
    assert (again.status_code, again.json()["error"]) == (
        409, "a token named 'ann' exists: revoke it first")
    bad = client.post("/v1/tokens", json={"name": "Ann!", "role": "viewer"}, headers=ADMIN)
    assert bad.status_code == 422 and "a token name is 1-64 of a-z 0-9" in bad.text
    bad = client.post("/v1/tokens", json={"name": "bob", "role": "root"}, headers=ADMIN)
    assert (bad.status_code, bad.json()["error"]) == (
        422, "a role is one of viewer, operator, admin, not 'root'")
    bad = client.post("/v1/tokens", json={"name": "api", "role": "viewer"}, headers=ADMIN)
    assert bad.status_code == 422 and "FERMIX_API_TOKEN's name" in bad.text


def test_every_route_checks_the_callers_role(client: TestClient) -> None:
    viewer, operator = make(client, "vic", "viewer"), make(client, "olga", "operator")
    admin = make(client, "ada", "admin")
    writes = [(m, p) for m, p in routes(client) if m not in ("GET", "HEAD")]
    assert len(writes) >= 9
    # A viewer changes nothing: every write is refused before its body is even read.
    for method, path in writes:
        resp = client.request(method, path, headers=viewer)
        assert resp.status_code == 403, (method, path, resp.text)
        assert reason(resp) == "this needs the operator role; the token 'vic' is a viewer" \
            or reason(resp) == "this needs the admin role; the token 'vic' is a viewer", resp.text
    # An operator acts on conversations, and changes nothing of the fleet's.
    admin_only = {("PUT", "/v1/budgets"), ("DELETE", "/v1/budgets"), ("POST", "/v1/tokens"),
                  ("DELETE", "/v1/tokens/x"), ("POST", "/v1/agents/x/kill"),
                  ("DELETE", "/v1/schedules/x"), ("POST", "/v1/skills/reload")}
    assert admin_only <= set(writes)
    for method, path in writes:
        resp = client.request(method, path, headers=operator)
        if (method, path) in admin_only:
            assert (resp.status_code, reason(resp)) == (
                403, "this needs the admin role; the token 'olga' is an operator"), path
        else:
            assert resp.status_code != 403, (method, path, resp.text)
    # Reads are for everyone with a token; the token list is the admins'.
    for method, path in routes(client):
        if method == "GET" and "{" not in path and path != "/v1/tokens":
            resp = client.get(path, headers=viewer)
            assert resp.status_code not in (401, 403), (path, resp.text)
    assert client.get("/v1/tokens", headers=viewer).status_code == 403
    assert client.get("/v1/tokens", headers=admin).status_code == 200
    # No token, or a wrong one: 401.
    assert client.get("/v1/status").status_code == 401
    assert client.get("/v1/status", headers={"Authorization": "Bearer fxt_nope"}
                      ).status_code == 401


def test_a_revoked_token_stops_at_once_and_every_change_names_its_token(
    client: TestClient, db: tuple[str, redis.Redis]
) -> None:
    ada = make(client, "ada", "admin")
    vic = make(client, "vic", "viewer")
    assert client.put("/v1/budgets", json={"scope": "agent:default", "period": "day",
                                           "usd": 5}, headers=ada).status_code == 200
    (budget,) = client.get("/v1/budgets", headers=vic).json()["budgets"]
    assert budget["setBy"] == "ada"
    assert client.post("/v1/approvals/ap_x", json={"decision": "approve"},
                       headers=vic).status_code == 403
    assert client.delete("/v1/budgets", params={"scope": "agent:default", "period": "day"},
                         headers=ada).status_code == 200
    revoked = client.delete("/v1/tokens/vic", headers=ada)
    assert (revoked.status_code, revoked.json()["revoked"]["name"]) == (200, "vic")
    assert client.get("/v1/status", headers=vic).status_code == 401
    assert client.delete("/v1/tokens/vic", headers=ada).status_code == 404

    entries = [(e.kind, e.action, e.outcome, e.actor, e.detail.get("token"))
               for e in reversed(AuditLog(db[1]).recent())]
    assert entries == [
        ("admin", "token.create", "ok", "http:api", "ada"),
        ("admin", "token.create", "ok", "http:api", "vic"),
        ("admin", "budget.set", "ok", "http:ada", None),
        ("check", "role", "fail", "http:vic", None),
        ("admin", "budget.remove", "ok", "http:ada", None),
        ("admin", "token.revoke", "ok", "http:ada", "vic"),
    ]
    refused = [e for e in AuditLog(db[1]).recent() if e.action == "role"][0]
    assert refused.detail == {"route": "POST /v1/approvals/ap_x", "role": "viewer",
                              "needs": "operator"}


def test_without_an_api_token_the_api_is_open_and_a_named_token_keeps_its_role(
    db: tuple[str, redis.Redis]
) -> None:
    with TestClient(create_app(Settings(redis_url=db[0], api_token=None))) as client:
        assert client.get("/v1/status").status_code == 200
        resp = client.post("/v1/tokens", json={"name": "vic", "role": "viewer"})
        assert resp.status_code == 201
        vic = {"Authorization": f"Bearer {resp.json()['token']}"}
        assert client.put("/v1/budgets", json={"scope": "total", "period": "day", "usd": 1},
                          headers=vic).status_code == 403
        assert client.put("/v1/budgets", json={"scope": "total", "period": "day", "usd": 1}
                          ).status_code == 200


def test_without_an_api_token_a_web_page_in_the_operators_browser_cannot_use_the_api(
    db: tuple[str, redis.Redis]
) -> None:
    """Open mode trusts whoever reaches the port, which a browser on the operator's machine
    does for any site it visits: a cross-site form or fetch that changes something is refused,
    and so is any browser request addressed to a name that is not loopback or the configured
    gateway (DNS rebinding: the page's own name resolving to 127.0.0.1)."""
    settings = Settings(redis_url=db[0], api_token=None, gateway_url="https://fx.example.com")
    budget = {"scope": "total", "period": "day", "usd": 1}
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8080") as client:
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        resp = client.put("/v1/budgets", json=budget, headers=evil)
        assert resp.status_code == 403
        assert "another origin" in reason(resp)
        rebound = {"Host": "evil.example:8080", "Origin": "http://evil.example:8080",
                   "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
        for resp in (client.get("/v1/conversations", headers=rebound),
                     client.put("/v1/budgets", json=budget, headers=rebound)):
            assert resp.status_code == 403
            assert "only on a loopback address or fx.example.com, not evil.example" in \
                reason(resp)
        # The console's own pages, the configured name, and scripts (no browser headers) pass.
        own = {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}
        assert client.put("/v1/budgets", json=budget, headers=own).status_code == 200
        proxied = {"Host": "fx.example.com", "Origin": "https://fx.example.com"}
        assert client.put("/v1/budgets", json=budget, headers=proxied).status_code == 200
        assert client.put("/v1/budgets", json=budget,
                          headers={"Host": "evil.example"}).status_code == 200
        assert db[1].exists(keys.budgets())
