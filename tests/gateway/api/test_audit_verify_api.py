"""``GET /v1/audit/verify``: the audit chain checked by the gateway (a read, any role), a page
at a time, with the same verdict as ``fermix audit verify``; an edited entry is found. The real
app in-process on a private Redis database (as test_tokens_api.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.api import audit as audit_api
from fermix_gateway.app import create_app
from fermix_shared import audit, keys
from fermix_shared.audit.store import AuditLog
from fermix_shared.settings import Settings

TOKEN = "env-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/7"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    yield url, r
    r.close()


@pytest.fixture
def client(db: tuple[str, redis.Redis]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(redis_url=db[0], api_token=TOKEN))) as c:
        yield c


def viewer(client: TestClient) -> dict[str, str]:
    resp = client.post("/v1/tokens", json={"name": "vic", "role": "viewer"}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def test_an_empty_chain_verifies(client: TestClient) -> None:
    resp = client.get("/v1/audit/verify", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"ok": True, "checked": 0, "problem": None,
                           "summary": "audit chain OK: 0 entries"}
    assert client.get("/v1/audit/verify").status_code == 401


def test_a_viewer_verifies_the_chain_page_by_page_as_the_cli_does(
    client: TestClient, db: tuple[str, redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    vic = viewer(client)  # token.create: the first entry
    for i in range(9):
        audit.record(db[1], "admin", "schedule.create", "ok", actor="cli", job=f"j{i}")
    monkeypatch.setattr(audit_api, "PAGE", 4)  # 10 entries: pages of 4, 4 and 2
    got = client.get("/v1/audit/verify", headers=vic).json()
    cli = AuditLog(db[1]).verify()
    assert cli.ok and cli.count == 10
    assert got == {"ok": True, "checked": 10, "problem": None, "summary": cli.describe()}


def test_an_edited_entry_breaks_the_chain_where_it_was_changed(
    client: TestClient, db: tuple[str, redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = db[1]
    for i in range(7):
        audit.record(r, "admin", "schedule.create", "ok", actor="cli", job=f"j{i}")
    entry = json.loads(r.hget(keys.audit_entries(), "6") or "")
    r.hset(keys.audit_entries(), "6", json.dumps({**entry, "actor": "mallory"}))
    monkeypatch.setattr(audit_api, "PAGE", 3)
    got = client.get("/v1/audit/verify", headers=ADMIN).json()
    cli = AuditLog(r).verify()
    assert cli.broken is not None and cli.broken.seq == 6
    assert got == {"ok": False, "checked": 5, "problem": cli.broken.describe(),
                   "summary": cli.describe()}
    assert "hash mismatch" in got["problem"]
    r.hdel(keys.audit_entries(), "7")  # the last one gone: its head says otherwise
    r.hset(keys.audit_entries(), "6", json.dumps(entry))
    got = client.get("/v1/audit/verify", headers=ADMIN).json()
    assert (got["ok"], got["checked"]) == (False, 6)
    assert got["problem"].startswith("entry #7: missing")
