"""``fermix audit tail | verify | export``: the real CLI against the scratch Redis; and what
the CLI's own admin commands (``schedule``, ``skills reload``) leave in the trail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from fermix_dev.procs import free_port
from fermix_shared import audit, keys


def fermix(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def env_for(url: str, home: Path) -> dict[str, str]:
    return {**os.environ, "FERMIX_REDIS_URL": url, "FERMIX_HOME": str(home)}


def fill(r: redis.Redis, n: int) -> None:
    for i in range(n):
        audit.record(r, "tool", "calculator", "ok" if i % 2 else "error", actor="telegram:42",
                     run_id=f"run_{i % 3}", conv="telegram|42|root",
                     agent="ops" if i % 2 else "default", ms=1.5, i=i)


def test_tail_shows_the_newest_filtered_oldest_first(r: redis.Redis, scratch_redis_url: str,
                                                     tmp_path: Path) -> None:
    env = env_for(scratch_redis_url, tmp_path)
    empty = fermix(env, "audit", "tail")
    assert (empty.returncode, empty.stdout) == (0, "No audit entries yet.\n")
    fill(r, 10)
    out = fermix(env, "audit", "tail", "-n", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["#8", "#9", "#10"]
    assert lines[-1].split("  ")[2:] == [
        "tool", "calculator", "ok", "telegram:42", "agent=ops", "run=run_0",
        "conv=telegram|42|root", "i=9", "ms=1.5"]
    as_json = json.loads(fermix(env, "audit", "tail", "--agent", "ops", "--run", "run_1",
                                "--json").stdout)
    assert [e["seq"] for e in as_json] == [2, 8]  # i = 1 and 7
    assert {(e["agent"], e["run"]) for e in as_json} == {("ops", "run_1")}
    assert fermix(env, "audit", "tail", "--run", "nope").stdout == "No audit entries match.\n"
    assert fermix(env, "audit", "tail", "-n", "0").returncode == 2


def test_verify_passes_then_names_an_edited_entry(r: redis.Redis, scratch_redis_url: str,
                                                   tmp_path: Path) -> None:
    env = env_for(scratch_redis_url, tmp_path)
    assert fermix(env, "audit", "verify").stdout == "audit chain OK: 0 entries\n"
    fill(r, 12)
    ok = fermix(env, "audit", "verify")
    assert ok.returncode == 0 and ok.stdout.startswith("audit chain OK: 12 entries from #1 to #12")
    entry = json.loads(str(r.hget(keys.audit_entries(), "5")))
    entry["outcome"] = "ok" if entry["outcome"] == "error" else "error"
    r.hset(keys.audit_entries(), "5", json.dumps(entry))
    bad = fermix(env, "audit", "verify")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("fermix: audit chain BROKEN at entry #5: hash mismatch: ")
    r.hdel(keys.audit_entries(), "5")
    gone = fermix(env, "audit", "verify")
    assert gone.returncode == 1
    assert gone.stderr.startswith("fermix: audit chain BROKEN at entry #5: missing")


def test_export_writes_json_lines_that_verify_on_their_own(r: redis.Redis, scratch_redis_url: str,
                                                           tmp_path: Path) -> None:
    env = env_for(scratch_redis_url, tmp_path)
    fill(r, 7)
    whole, tail = tmp_path / "all.jsonl", tmp_path / "tail.jsonl"
    out = fermix(env, "audit", "export", str(whole))
    assert out.stdout == f"Exported 7 audit entries (#1 to #7) to {whole}.\n"
    assert fermix(env, "audit", "export", str(tail), "--since", "4").stdout == (
        f"Exported 3 audit entries (#5 to #7) to {tail}.\n")
    assert [json.loads(line)["seq"] for line in tail.read_text().splitlines()] == [5, 6, 7]
    assert whole.read_text().splitlines()[0] == r.hget(keys.audit_entries(), "1")
    for f, first in ((whole, 1), (tail, 5)):
        checked = fermix(env, "audit", "verify", "--file", str(f))
        assert checked.returncode == 0
        assert checked.stdout.startswith(f"audit chain OK: {8 - first} entries from #{first} to #7")
    lines = tail.read_text().splitlines()
    edited = json.loads(lines[1])
    edited["actor"] = "telegram:1"
    tail.write_text("\n".join([lines[0], json.dumps(edited), lines[2]]) + "\n")
    bad = fermix(env, "audit", "verify", "--file", str(tail))
    assert bad.returncode == 1 and "entry #6: hash mismatch" in bad.stderr
    streamed = fermix(env, "audit", "export", "-", "--since", "6")
    assert [json.loads(line)["seq"] for line in streamed.stdout.splitlines()] == [7]


def test_the_cli_s_own_changes_are_audited(r: redis.Redis, scratch_redis_url: str,
                                          tmp_path: Path) -> None:
    env = env_for(scratch_redis_url, tmp_path)
    assert fermix(env, "schedule", "add", "daily", "--every", "3600", "-m",
                  "send the report to ceo@example.com").returncode == 0
    assert fermix(env, "schedule", "pause", "daily").returncode == 0
    assert fermix(env, "schedule", "rm", "daily").returncode == 0
    assert fermix(env, "skills", "reload").returncode == 0
    got = json.loads(fermix(env, "audit", "tail", "--json").stdout)
    assert [(e["kind"], e["action"], e["actor"]) for e in got] == [
        ("admin", "schedule.create", "cli"), ("admin", "schedule.pause", "cli"),
        ("admin", "schedule.remove", "cli"), ("admin", "skill.reload", "cli")]
    assert got[0]["detail"]["message_sha256"] == audit.text_digest(
        "send the report to ceo@example.com")
    assert "ceo@example.com" not in str(r.hgetall(keys.audit_entries()))


def test_an_unreachable_redis_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    env = env_for(f"redis://127.0.0.1:{free_port()}/0", tmp_path)
    out = fermix(env, "audit", "verify")
    assert out.returncode == 1 and out.stderr.startswith("fermix: cannot reach Redis")
