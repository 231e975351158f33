"""Commands answered by the gateway itself (run API), with the caller's trust."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_gateway.commands import Command, parse_command
from fermix_shared import keys
from fermix_shared.models import InboundMessage
from fermix_shared.settings import Settings


@pytest.mark.parametrize(
    ("text", "bot", "parsed"),
    [
        ("/stop", None, Command("stop", "")),
        ("  /ULTRA  find everything ", None, Command("ultra", "find everything")),
        ("/new@FermixBot", "fermixbot", Command("new", "")),
        ("/new@OtherBot", "fermixbot", None),
        ("/new@OtherBot", None, None),
        ("/unknown", None, None),
        ("/etc/passwd is a path", None, None),
        ("hello /stop", None, None),
    ],
)
def test_parse_command(text: str, bot: str | None, parsed: Command | None) -> None:
    assert parse_command(text, bot) == parsed


@pytest.fixture
def client(redis_url: str) -> Iterator[TestClient]:
    url = redis_url.rsplit("/", 1)[0] + "/8"
    redis.Redis.from_url(url).flushdb()
    with TestClient(create_app(Settings(redis_url=url))) as c:
        yield c


def command(client: TestClient, text: str, chat: str = "c1") -> dict:
    run_id = client.post("/v1/agent", json={"message": text, "chatId": chat}).json()["runId"]
    return client.get(f"/v1/runs/{run_id}/wait", params={"timeout": 5}).json()


def test_commands_answer_at_once(client: TestClient) -> None:
    assert command(client, "/whoami")["reply"] == "You are http:api (operator)."
    assert command(client, "/ultra")["reply"] == "Usage: /ultra <prompt>"
    assert command(client, "/help")["reply"].startswith("Commands:\n/new")
    assert command(client, "/status")["reply"] == (
        "Here nothing is running; 0 messages queued; queue mode followup.")
    assert command(client, "/clear")["reply"] == "Started a fresh conversation. Long-term memory is kept."
    assert command(client, "/queue collect")["reply"] == "Queue mode set to collect."
    assert command(client, "/queue")["reply"] == "Queue mode for this conversation: collect."
    assert command(client, "/queue sideways")["reply"].startswith("Unknown queue mode 'sideways'")


def test_ultra_with_a_prompt_queues_an_ultra_run(client: TestClient) -> None:
    resp = client.post("/v1/agent", json={"message": "/ultra survey the field", "chatId": "u1"})
    run = client.get(f"/v1/runs/{resp.json()['runId']}").json()
    assert run["status"] == "queued"
    url = client.app.state.settings.redis_url  # type: ignore[attr-defined]
    (raw,) = redis.Redis.from_url(url).lrange(keys.inbox("http|u1|root"), 0, -1)
    queued = InboundMessage.model_validate_json(raw)
    assert (queued.text, queued.profile, queued.trust) == ("survey the field", "ultra", "operator")


def test_new_ends_the_session_and_starts_another_through_the_hooks(redis_url: str) -> None:
    from fermix_shared.hooks import HookRegistry

    seen: list[tuple[str, str]] = []

    class Sessions:
        def session_end(self, payload: dict) -> None:
            seen.append(("end", payload["conversation"]))

        def session_start(self, payload: dict) -> None:
            seen.append(("start", payload["conversation"]))

    hooks = HookRegistry()
    hooks.register("sessions", Sessions())
    url = redis_url.rsplit("/", 1)[0] + "/8"
    with TestClient(create_app(Settings(redis_url=url), hooks=hooks)) as c:
        assert command(c, "/new", chat="s1")["reply"].startswith("Started a fresh conversation")
    assert seen == [("end", "http|s1|root"), ("start", "http|s1|root")]
