"""``fermix schedule add --agent NAME`` and the agent of each job in ``fermix schedule list``
and ``GET /v1/status``: the real CLI (a subprocess on the scratch Redis) and the real gateway
app (uvicorn in a thread of this process). A job runs as the agent it names, so an agent that
is not declared, or is a ``sub`` agent, is refused with exit 2 and one sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
import uvicorn

from fermix_dev.procs import free_port, wait_until
from fermix_gateway.app import create_app
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.hooks import HookRegistry
from fermix_shared.scheduling.store import JobStore
from fermix_shared.settings import Settings
from tests.gateway.inprocess import RecordingCelery

TOKEN = "sched-t0k"
AGENTS = [AgentDefinition(name="reporter", system_prompt="You report.", policy=["read_only"]),
          AgentDefinition(name="helper", role="sub")]


@pytest.fixture(scope="module")
def gateway(scratch_redis_url: str) -> Iterator[str]:
    settings = Settings(redis_url=scratch_redis_url, api_token=TOKEN, agents=AGENTS)
    app = create_app(settings, hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "in-process gateway")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def schedule(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FERMIX_REDIS_URL": redis_url,
           "FERMIX_AGENTS": json.dumps([a.model_dump(mode="json") for a in AGENTS])}
    return subprocess.run([sys.executable, "-m", "fermix_cli", "schedule", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def test_add_agent_runs_the_job_as_that_agent_and_list_and_status_show_it(
    gateway: str, scratch_redis_url: str, r: redis.Redis
) -> None:
    refused = {
        "nope": "fermix: no agent named 'nope' is declared (`fermix agents list` shows the "
                "agents)\n",
        "helper": "fermix: agent 'helper' is a 'sub' agent: a job runs as a 'main' agent\n",
    }
    adds = [["add", f"by-{agent}", "--every", "60", "-m", "x", "--agent", agent]
            for agent in refused]
    adds += [["add", "daily", "--cron", "0 9 * * *", "-m", "report", "--agent", "reporter"],
             ["add", "plain", "--every", "60", "-m", "x", "--json"]]
    with ThreadPoolExecutor(len(adds)) as pool:  # one CLI process each, at once
        *bad, made, plain = pool.map(lambda args: schedule(scratch_redis_url, *args), adds)
    for out, sentence in zip(bad, refused.values(), strict=True):
        assert (out.returncode, out.stderr, out.stdout) == (2, sentence, "")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("Scheduled job 'daily' (agent reporter): cron 0 9 * * * (UTC)")
    assert plain.returncode == 0, plain.stderr
    made_json = json.loads(plain.stdout)  # --json: the job as stored
    assert (made_json["name"], made_json["agent"], made_json["state"]) == (
        "plain", "default", "active")
    store = JobStore(r)
    assert [(j.name, j.agent, j.trust) for j in store.all()] == [
        ("daily", "reporter", "operator"), ("plain", "default", "operator")]

    with ThreadPoolExecutor(2) as pool:
        text, as_json = pool.map(lambda args: schedule(scratch_redis_url, *args),
                                 [["list"], ["list", "--json"]])
    table = text.stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "AGENT", "SCHEDULE"]
    assert [row.split()[:2] for row in table[1:]] == [["daily", "reporter"], ["plain", "default"]]
    listed = json.loads(as_json.stdout)
    assert [(j["name"], j["agent"]) for j in listed] == [("daily", "reporter"), ("plain", "default")]
    # Actions with --json: the job as it is now.
    paused = json.loads(schedule(scratch_redis_url, "pause", "plain", "--json").stdout)
    assert (paused["name"], paused["state"]) == ("plain", "paused")
    resumed = json.loads(schedule(scratch_redis_url, "resume", "plain", "--json").stdout)
    assert (resumed["name"], resumed["state"]) == ("plain", "active")

    status = httpx.get(f"{gateway}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status.status_code == 200, status.text
    assert [(j["name"], j["agent"], j["trust"], j["schedule"])
            for j in status.json()["schedules"]] == [
        ("daily", "reporter", "operator", "cron 0 9 * * * (UTC)"),
        ("plain", "default", "operator", "every 60s")]
