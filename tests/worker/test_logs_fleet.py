"""JSON logs from real processes: a worker (at DEBUG) and a gateway with FERMIX_LOG_FORMAT=json
run one turn against the scripted model; the worker's lines carry that turn's run_id and
conversation, and neither the API token nor the provider key reaches either log, although the
provider's refusal of the turn's memory review quotes the key (the worker logs that error)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.procs import Managed, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail, Reply
from fermix_shared.logs import MASK
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import post, uniq, wait

TOKEN = "fleet-api-token-8c1e77"
PROVIDER_KEY = "sk-fleet-provider-key-41f0"


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "OPENAI_API_KEY": PROVIDER_KEY,
           "FERMIX_API_TOKEN": TOKEN, "FERMIX_LOG_FORMAT": "json",
           # The memory review runs as soon as the conversation is quiet (one reaper scan).
           "FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "0"}
    s = start_stack("jsonlogs", redis_url, 6, env, logs_dir, workers=0)
    w = Managed("jsonlogs-w1",
                [sys.executable, "-m", "fermix_cli", "worker", "--concurrency", "5",
                 "--name", "jsonlogs-w1@%h", "--log-level", "DEBUG"],
                env=s.env, log_path=logs_dir / "jsonlogs-w1.log")
    s.workers.append(w)
    s.procs.append(w)
    s.wait_for_worker(w)
    yield s
    s.stop()


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_worker_logs_json_with_the_turn_context_and_no_secret(
        stack: Stack, llm: ScriptedLLMServer) -> None:
    text = uniq("my token is " + TOKEN)
    llm.script.push(Reply("noted", match=text),
                    Fail(401, f"Incorrect API key provided: {PROVIDER_KEY}", match=f"user: {text}"))
    with stack.http(TOKEN) as http:
        resp = post(http, text, "jsonlogs")
        assert resp.status_code == 202, resp.text
        run = wait(http, resp.json()["runId"])
    assert run["status"] == "ok" and run["reply"] == "noted"
    worker_log = stack.logs / "jsonlogs-w1.log"
    wait_until(lambda: "memory review for" in worker_log.read_text(), 30, "memory review",
               stack.workers[0].proc)
    for p in stack.procs:
        p.stop()  # flushes and closes the logs

    lines = json_lines(worker_log)
    assert lines and all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    turn = [x for x in lines if x.get("run_id") == run["runId"]]
    assert turn, "no worker line carries the turn's run_id"
    conv = {x["conversation"] for x in turn}
    assert len(conv) == 1 and "|jsonlogs|" in conv.pop()
    assert {x.get("agent") for x in turn} == {"default"}
    assert all(x["worker"].startswith("jsonlogs-w1@") for x in turn)
    (refused,) = [x for x in lines if x["msg"].startswith("memory review for")]
    assert "Incorrect API key provided: " + MASK in refused["msg"]

    gateway_log = stack.logs / "jsonlogs-gateway.log"
    access = [x for x in json_lines(gateway_log) if x["logger"] == "uvicorn.access"]
    # The request's access line names the run it accepted.
    assert any("POST /v1/agent" in x["msg"] and x.get("run_id") == run["runId"]
               and "|jsonlogs|" in x.get("conversation", "") for x in access), access
    for path in (worker_log, gateway_log):
        raw = path.read_text()
        assert TOKEN not in raw and PROVIDER_KEY not in raw, path
