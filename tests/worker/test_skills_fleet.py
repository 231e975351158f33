"""Skills across a fleet: two real workers with different FERMIX_HOME disks (two hosts) on one
Redis. A skill created through ``skill_create`` on a turn one worker runs is in the other
worker's next prompt, without a restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.models import RunRecord
from fermix_shared.stores import runs
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, turn_calls, uniq, wait

WORKERS = {"skills-w1", "skills-w2"}
# Each worker holds at most 2 turns (prefetch 1), so 5 slow turns at once reach both.
CONCURRENCY = 2
BATCH = 5


@pytest.fixture(scope="module")
def hosts(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("skills", redis_url, 2, provider_env(llm, "openai"), logs_dir, workers=0)
    try:
        for name in ("skills-w1", "skills-w2"):
            s.env = {**s.env, "FERMIX_HOME": str(logs_dir / name)}
            s.start_worker(name, concurrency=CONCURRENCY)
    except Exception:
        s.stop()
        raise
    yield s
    s.stop()


def run_turns(stack: Stack, http: httpx.Client, llm: ScriptedLLMServer, texts: list[str],
              *replies: Reply) -> list[RunRecord]:
    """Start a turn per text at once (slow replies unless ``replies``), wait for them all."""
    llm.script.push(*(replies or [Reply(text="ok", delay=1.0, match=t) for t in texts]))
    run_ids = [start(http, t, uniq("chat")) for t in texts]
    records = []
    for run_id in run_ids:
        assert wait(http, run_id)["status"] == "ok"
        record = runs.get(stack.redis(), run_id)
        assert record is not None and record.worker is not None
        records.append(record)
    return records


def node(record: RunRecord) -> str:
    assert record.worker is not None
    return record.worker.split("@", 1)[0]


def system_of(llm: ScriptedLLMServer, text: str) -> str:
    (first, *_) = [r for r in turn_calls(llm.script.requests) if text in json.dumps(r["body"])]
    return str(first["body"]["messages"][0]["content"])


def test_a_skill_created_on_one_worker_is_in_the_other_workers_next_prompt(
    hosts: Stack, llm: ScriptedLLMServer, logs_dir: Path
) -> None:
    with hosts.http() as http:
        # Both workers have run a turn (and so hold a registry snapshot) before the skill exists.
        warm = run_turns(hosts, http, llm, [uniq("warm") for _ in range(BATCH)])
        assert {node(rec) for rec in warm} == WORKERS
        create = uniq("create")
        (made,) = run_turns(hosts, http, llm, [create], Reply(tool_calls=[ToolCallSpec(
            "skill_create", {"name": "fleet-digest", "description": "Summarise the fleet's day.",
                             "instructions": "1. Collect.\n2. Summarise."},
        )], match=create), Reply(text="created", match=create))
        creator = node(made)
        (other,) = WORKERS - {creator}
        assert "fleet-digest" not in system_of(llm, create)

        texts = [uniq("after") for _ in range(BATCH)]
        ran = dict(zip(texts, map(node, run_turns(hosts, http, llm, texts)), strict=True))
    on_other = [t for t in texts if ran[t] == other]
    assert on_other, ran
    for text in texts:  # every later turn, on either host, lists it
        assert "- fleet-digest: Summarise the fleet's day." in system_of(llm, text)
    # Only the creating host's disk has the file; the other worker read it from Redis.
    assert (logs_dir / creator / "skills" / "fleet-digest" / "SKILL.md").is_file()
    assert not (logs_dir / other / "skills" / "fleet-digest").exists()
