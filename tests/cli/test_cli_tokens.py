"""``fermix tokens create | list | revoke`` against an in-process gateway (uvicorn) over a
private Redis: the token is printed once, works with its role, and stops when revoked."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest
import redis
import uvicorn

from fermix_dev.procs import free_port, wait_until
from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.cli.test_cli_usage import TOKEN, fermix


@pytest.fixture(scope="module")
def url(scratch_redis_url: str) -> Iterator[str]:
    base = scratch_redis_url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(base).flushdb()
    app = create_app(Settings(redis_url=base, api_token=TOKEN), hooks=HookRegistry())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "in-process gateway")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_create_prints_the_token_once_list_shows_it_and_revoke_stops_it(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: str) -> tuple[int, str, str]:
        return fermix(url, monkeypatch, capsys, "tokens", *args)

    code, out, err = run("create", "--name", "ann", "--role", "operator")
    assert (code, err) == (0, "Token ann (operator) created; it is shown this once:\n")
    secret = out.strip()
    assert secret.startswith("fxt_") and out == f"{secret}\n"
    ann = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{url}/v1/status", headers=ann).status_code == 200
    refused = httpx.put(f"{url}/v1/budgets", headers=ann,
                        json={"scope": "total", "period": "day", "usd": 1})
    assert (refused.status_code, refused.json()["error"]) == (
        403, "this needs the admin role; the token 'ann' is an operator")

    code, out, _ = run("list")
    assert code == 0
    (line,) = out.splitlines()
    assert line.startswith(f"ann                  operator  …{secret[-4:]}  made ")
    assert line.endswith(" UTC by api") and secret not in out

    code, _, err = run("create", "--name", "ann", "--role", "viewer")
    assert (code, err) == (1, "fermix: a token named 'ann' exists: revoke it first\n")
    code, _, err = run("create", "--name", "ann", "--role", "root")
    assert code == 2 and "invalid choice: 'root'" in err
    code, _, err = run("create", "--name", "No Spaces", "--role", "viewer")
    assert code == 2 and "a token name is 1-64 of a-z 0-9" in err

    assert run("revoke", "ann") == (
        0, "Token ann (operator) revoked: it no longer works on any gateway.\n", "")
    assert httpx.get(f"{url}/v1/status", headers=ann).status_code == 401
    assert run("revoke", "ann") == (1, "", "fermix: no token is named 'ann'\n")
    run("create", "--name", "bob", "--role", "viewer")
    code, out, _ = run("revoke", "bob", "--json")  # what changed, as the gateway says it
    revoked = json.loads(out)["revoked"]
    assert code == 0 and (revoked["name"], revoked["role"]) == ("bob", "viewer")
    assert run("list") == (0, "no named tokens (FERMIX_API_TOKEN is the admin token)\n", "")
