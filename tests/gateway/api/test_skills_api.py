"""``/v1/skills``: the skill registry over HTTP, on the gateway in this process (TestClient) over
a private Redis (scratch database 11) and a ``FERMIX_HOME`` of the test's own. Every role
lists the skills with their trust and root (home, bundled, plugin, created) and the files that
could not be loaded with why; only an admin reloads, which bumps the fleet-wide version and
is audited with the admin's token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.audit.store import AuditLog
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.gateway.inprocess import RecordingCelery

TOKEN = "skills-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def skill(folder: Path, name: str, text: str | None = None) -> Path:
    path = folder / name / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(text if text is not None else
                    f"---\nname: {name}\ndescription: The {name} skill.\n---\nDo {name}.\n")
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    skill(tmp_path / "skills", "deploy")
    skill(tmp_path / "plugins" / "acme" / "skills", "lookup")
    skill(tmp_path / "skills", "broken", "no frontmatter here\n")
    return tmp_path


@pytest.fixture
def db(scratch_redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(scratch_redis_url.rsplit("/", 1)[0] + "/11", decode_responses=True)
    r.flushdb()
    yield r
    r.close()


@pytest.fixture
def client(db: redis.Redis, scratch_redis_url: str, home: Path) -> Iterator[TestClient]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/11"
    app = create_app(Settings(redis_url=url, api_token=TOKEN, home=home), hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def make(client: TestClient, name: str, role: str) -> dict[str, str]:
    resp = client.post("/v1/tokens", json={"name": name, "role": role}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def test_every_role_lists_the_skills_with_trust_and_root_and_the_files_not_loaded(
    client: TestClient, db: redis.Redis, home: Path
) -> None:
    db.hset(keys.skills_created(), "made",
            "---\nname: made\ndescription: Made by a tool.\n---\nDo it.\n")
    viewer = make(client, "vic", "viewer")
    resp = client.get("/v1/skills", headers=viewer)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    found = {s["name"]: (s["trust"], s["root"]) for s in body["skills"]}
    assert found == {"deploy": ("operator", "home"), "lookup": ("guest", "plugin"),
                     "made": ("operator", "created"), "write-a-skill": ("operator", "bundled")}
    (deploy,) = [s for s in body["skills"] if s["name"] == "deploy"]
    assert deploy["description"] == "The deploy skill."
    assert deploy["source"] == str(home / "skills" / "deploy" / "SKILL.md")
    (issue,) = body["issues"]
    assert (issue["source"], issue["root"]) == (str(home / "skills" / "broken" / "SKILL.md"),
                                                "home")
    assert issue["error"]
    assert body["version"] == "0"
    # The same registry GET /v1/status shows.
    status = client.get("/v1/status", headers=viewer).json()
    assert [s["name"] for s in status["available_skills"]] == [s["name"] for s in body["skills"]]
    assert client.get("/v1/skills").status_code == 401


def test_only_an_admin_reloads_and_the_reload_is_audited(
    client: TestClient, db: redis.Redis, home: Path
) -> None:
    viewer, operator = make(client, "vic", "viewer"), make(client, "olga", "operator")
    admin = make(client, "ada", "admin")
    for who, role in ((viewer, "a viewer"), (operator, "an operator")):
        refused = client.post("/v1/skills/reload", headers=who)
        assert refused.status_code == 403
        assert refused.json()["error"].endswith(f"is {role}")
    assert db.get(keys.skills_version()) is None

    skill(home / "skills", "fresh")  # on disk now: a reload makes the workers see it
    resp = client.post("/v1/skills/reload", headers=admin)
    assert resp.status_code == 200, resp.text
    assert resp.json()["version"] == "1"
    assert "fresh" in [s["name"] for s in resp.json()["skills"]]
    assert db.get(keys.skills_version()) == "1"
    assert client.post("/v1/skills/reload", headers=admin).json()["version"] == "2"
    reloads = [e for e in AuditLog(db).recent() if e.action == "skill.reload"]
    assert [(e.kind, e.outcome, e.actor, e.detail["version"]) for e in reversed(reloads)] == [
        ("admin", "ok", "http:ada", "1"), ("admin", "ok", "http:ada", "2")]
