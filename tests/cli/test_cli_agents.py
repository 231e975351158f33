"""``fermix agents list | pause | resume | kill NAME`` and the agents in ``fermix status``: the real
CLI against the real gateway app (uvicorn in a thread of this process, scratch Redis, Celery
recorded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from fermix_cli.status import format_status
from fermix_dev.procs import free_port
from fermix_shared import keys
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.stores import queue
from tests.cli.conftest import TOKEN
from tests.gateway.inprocess import DISPATCH_TASK, RecordingCelery


def fermix(url: str, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FERMIX_GATEWAY_URL": url, "FERMIX_API_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "fermix_cli", "agents", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def test_list_pause_and_resume(served: tuple[str, RecordingCelery], r: redis.Redis) -> None:
    url, celery = served
    out = fermix(url, "list")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "default (main): created, 0 active, 0 pending",
        "ops (main): created, 0 active, 0 pending",
        "helper (sub): created, 0 active, 0 pending",
    ]

    paused = fermix(url, "pause", "ops")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout == ("Agent ops is paused: its messages queue (0 pending) and run when "
                             "you resume it (fermix agents resume ops).\n")
    key = ConversationKey(channel="http", chat_id="cli")
    queue.accept(r, InboundMessage(key=key, text="wait", agent="ops"))
    assert queue.claim(r, key.as_str(), "w1", 30)[0].kind == "paused"
    listed = json.loads(fermix(url, "list", "--json").stdout)["agents"]
    assert {a["name"]: (a["state"], a["pending"]) for a in listed}["ops"] == ("paused", 1)

    resumed = fermix(url, "resume", "ops")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "Agent ops is active: 1 conversation released to run what queued.\n"
    assert [key.as_str()] in celery.named(DISPATCH_TASK)
    assert not r.exists(keys.agents_paused())


@pytest.mark.parametrize(("args", "said"), [
    (("pause", "nobody"), "fermix: no agent named 'nobody' (agents: default, ops, helper)"),
    (("resume", "nobody"), "fermix: no agent named 'nobody' (agents: default, ops, helper)"),
    (("pause", "Bad/Name"), "fermix: no agent named 'Bad/Name' (agent names are 1-64 lowercase "
                            "letters, digits, '-' or '_')"),
    (("pause", "helper"), "fermix: agent 'helper' has role 'sub': it runs only inside other "
                          "agents' turns, pause those instead"),
    (("kill", "nobody"), "fermix: no agent named 'nobody' (agents: default, ops, helper)"),
    (("kill", "helper"), "fermix: agent 'helper' has role 'sub': it runs only inside other "
                         "agents' turns, kill those instead"),
], ids=["unknown", "resume-unknown", "not-a-name", "sub-agent", "kill-unknown", "kill-sub"])
def test_bad_names_are_one_sentence_and_exit_1(
    served: tuple[str, RecordingCelery], args: tuple[str, str], said: str
) -> None:
    out = fermix(served[0], *args)
    assert (out.returncode, out.stdout, out.stderr.strip()) == (1, "", said)


def test_a_wrong_token_or_no_gateway_is_one_sentence_and_exit_1(
    served: tuple[str, RecordingCelery]
) -> None:
    out = fermix(served[0], "list", token="wrong")
    assert out.returncode == 1 and out.stderr.strip() == (
        "fermix: the gateway refused the agents request (HTTP 401): invalid bearer token")
    dead = f"http://127.0.0.1:{free_port()}"
    out = fermix(dead, "pause", "ops")
    assert out.returncode == 1
    assert out.stderr.startswith(f"fermix: cannot reach the gateway at {dead}")


def test_fermix_status_lists_the_agents() -> None:
    status = {
        "workers": [], "workersSeen": 0, "activeConversations": 1, "pendingConversations": 1,
        "activeRequests": 1, "pendingRequests": 3,
        "primary_provider": "openai", "model": "m", "fallback_providers": [],
        "conversations": [],
        "agents": [
            {"name": "default", "role": "main", "state": "idle", "active": 0, "pending": 0},
            {"name": "ops", "role": "main", "state": "paused", "active": 1, "pending": 3,
             "model": "openai/gpt-4.1-mini", "pausedAt": 1},
        ],
    }
    assert format_status(status).splitlines()[3:] == [
        "agents: 2",
        "  default (main): idle, 0 active, 0 pending",
        "  ops (main, model openai/gpt-4.1-mini): paused, 1 active, 3 pending",
    ]


def test_kill_stops_the_agent_and_pause_cannot_bring_it_back(
    served: tuple[str, RecordingCelery], r: redis.Redis
) -> None:
    url, _ = served
    key = ConversationKey(channel="http", chat_id="cli-kill")
    queue.accept(r, InboundMessage(key=key, text="working", agent="ops"))
    assert queue.claim(r, key.as_str(), "w1", 30)[0].kind == "claimed"
    killed = fermix(url, "kill", "ops")
    assert killed.returncode == 0, killed.stderr
    assert killed.stdout == (
        "Agent ops is killed: 1 running turn stopped (with their subagents), and its messages "
        "are refused with a reply. It stays killed until its definition is re-created (declared "
        "again with a change).\n")
    assert r.hget(keys.active(key.as_str()), "cancelled") == "killed"
    assert "ops (main): killed, 1 active, 0 pending" in fermix(url, "list").stdout.splitlines()
    listed = json.loads(fermix(url, "list", "--json").stdout)["agents"]
    assert {a["name"]: a["state"] for a in listed} == {
        "default": "created", "ops": "killed", "helper": "created"}
    for verb in ("pause", "resume"):
        out = fermix(url, verb, "ops")
        assert (out.returncode, out.stdout, out.stderr.strip()) == (
            1, "", "fermix: agent 'ops' was killed: it takes no turns until its definition is "
                   "re-created (declared again with a change)")
    again = fermix(url, "kill", "ops")
    assert again.returncode == 0 and "0 running turns stopped" in again.stdout
