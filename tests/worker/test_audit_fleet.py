"""One audit chain for the whole fleet: three real workers run 50 tool-using turns at once and
every tool call lands in one valid hash chain (``fermix audit verify``, the real CLI, passes);
an entry edited in Redis afterwards makes verify fail naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.stores import runs
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, uniq, wait

TURNS = 50


@pytest.fixture(scope="module")
def fleet(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    s = start_stack("audit", redis_url, 11, provider_env(llm, "openai"), logs_dir, workers=3)
    yield s
    s.stop()


def verify(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", "audit", "verify"],
                          env=stack.env, capture_output=True, text=True, timeout=60)


def test_fifty_concurrent_turns_on_three_workers_make_one_valid_chain(
        fleet: Stack, llm: ScriptedLLMServer) -> None:
    texts = [uniq("calc") for _ in range(TURNS)]
    for i, text in enumerate(texts):
        llm.script.push(
            Reply(tool_calls=[ToolCallSpec("calculator", {"expression": f"{i} * 3"})],
                  match=text),
            Reply(text=f"it is {i * 3}", match=text))
    with fleet.http() as http:
        run_ids = [start(http, text, uniq("chat")) for text in texts]
        for i, run_id in enumerate(run_ids):
            done = wait(http, run_id, timeout=60)
            assert (done["status"], done["reply"]) == ("ok", f"it is {i * 3}")
    r = fleet.redis()
    holders = {str(runs.get(r, run_id).worker).split("@")[0] for run_id in run_ids}  # type: ignore[union-attr]
    assert len(holders) >= 2, holders  # the chain was written from more than one process

    out = verify(fleet)
    assert out.returncode == 0, out.stderr
    entries = {int(k): json.loads(v) for k, v in r.hgetall(keys.audit_entries()).items()}
    assert out.stdout.startswith(f"audit chain OK: {len(entries)} entries from #1 to "
                                 f"#{len(entries)}")
    tools = [e for e in entries.values() if e["kind"] == "tool"]
    assert len(tools) == TURNS
    assert {e["run"] for e in tools} == set(run_ids)
    assert {(e["action"], e["outcome"], e["actor"]) for e in tools} == {
        ("calculator", "ok", "http:api")}
    trusted = [e for e in entries.values() if e["kind"] == "trust"]
    assert len(trusted) == TURNS

    seq = min(int(e["seq"]) for e in tools) + 7
    edited = entries[seq]
    edited["detail"]["ms"] = 0.0 if edited["detail"].get("ms") else 1.0
    r.hset(keys.audit_entries(), str(seq), json.dumps(edited))
    broken = verify(fleet)
    assert broken.returncode == 1
    assert broken.stderr.startswith(f"fermix: audit chain BROKEN at entry #{seq}: hash mismatch")
