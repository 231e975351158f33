"""Commands answered by the gateway itself (run API), with the caller's trust."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_gateway.commands import COMMANDS, Command, parse_command
from fermix_shared import keys
from fermix_shared.hooks import HOOK_NAMES, HookRegistry, attribute_of, command_hook
from fermix_shared.models import InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import sessions
from tests.seed_text import quoted


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


class Recorder:
    """A hook plugin that notes every hook it hears, with its payload."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, dict]] = []
        for hook in HOOK_NAMES:
            setattr(self, attribute_of(hook), self._noting(hook))

    def _noting(self, hook: str) -> Callable[[dict], None]:
        return lambda payload: self.heard.append((hook, payload))

    def names(self) -> list[str]:
        return [hook for hook, _ in self.heard]


def hooked_client(redis_url: str, plugin: object) -> TestClient:
    url = redis_url.rsplit("/", 1)[0] + "/8"
    hooks = HookRegistry()
    hooks.register("recorder", plugin)
    return TestClient(create_app(Settings(redis_url=url), hooks=hooks))


def test_command_hooks_hear_new_reset_stop_and_the_other_commands(redis_url: str) -> None:
    # "Command hooks: `/new`, `/reset`, `/stop`, and other command events".
    said = quoted("S", "**Command hooks**: `/new`, `/reset`, `/stop`, and other command events")
    named = re.findall(r"`/(\w+)`", said)
    assert named == ["new", "reset", "stop"]
    plugin = Recorder()
    with hooked_client(redis_url, plugin) as c:
        for name in (*named, "status", "whoami"):
            command(c, f"/{name}", chat="h1")
    commands_heard = [(h, p["command"]) for h, p in plugin.heard if h.startswith("command")]
    assert commands_heard == [
        (hook, name) for name in (*named, "status", "whoami")
        for hook in ("command", f"command:{name}")
    ]
    (stop,) = [p for h, p in plugin.heard if h == "command:stop"]
    assert stop == {"command": "stop", "args": "", "conversation": "http|h1|root",
                    "by": "http:api", "trust": "operator"}


def test_every_chat_command_has_its_own_hook() -> None:
    assert all(command_hook(name) == f"command:{name}" for name in COMMANDS)


def test_reset_is_the_seeds_alias_of_new(client: TestClient) -> None:
    assert quoted("S", "`/reset`")
    r = redis.Redis.from_url(client.app.state.settings.redis_url)  # type: ignore[attr-defined]
    r.rpush(keys.history("http|r1|root"), '{"role": "user", "content": "old"}')
    assert command(client, "/reset", chat="r1")["reply"] == command(client, "/new", chat="r0")["reply"]
    assert not r.exists(keys.history("http|r1|root"))
    assert "/reset" in command(client, "/help")["reply"]


def test_new_ends_the_conversations_session_and_starts_none(redis_url: str) -> None:
    # The session starts with the conversation's first message (a worker's turn: see
    # tests/worker/turn/test_start_hooks.py); here one has, as its turn left it.
    plugin = Recorder()
    url = redis_url.rsplit("/", 1)[0] + "/8"
    conv = "http|s1|root"
    redis.Redis.from_url(url).delete(keys.session(conv))
    session_id = sessions.begin(redis.Redis.from_url(url, decode_responses=True), conv)
    with hooked_client(redis_url, plugin) as c:
        assert command(c, "/new", chat="s1")["reply"].startswith("Started a fresh conversation")
        command(c, "/new", chat="s1")  # no session left to end
    ends = [p for h, p in plugin.heard if h.startswith("session")]
    assert [h for h in plugin.names() if h.startswith("session")] == ["session_end"]
    assert ends == [{"conversation": conv, "session_id": session_id, "by": "http:api",
                     "reason": "new"}]
