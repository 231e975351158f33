"""What a person at a terminal sees, and what a script reading a pipe gets: tables and colour
on a terminal, the same plain lines as ever when piped, one JSON document with ``--json``, and
progress on a terminal's stderr only (``fermix_cli/output.py``). Real ``fermix`` processes,
their streams on pseudo-terminals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import redis

from fermix_dev.procs import free_port
from fermix_shared import audit
from tests.cli.conftest import TOKEN
from tests.cli.terminal import clean_env, fermix, plain
from tests.gateway.inprocess import RecordingCelery

GREEN = "\x1b[32m"

# Every test here runs `fermix` (tests/cli/terminal.py starts it on a terminal or a pipe).
pytestmark = pytest.mark.fleet


@pytest.fixture
def env(r: redis.Redis, scratch_redis_url: str, tmp_path: Path) -> dict[str, str]:
    for i in range(5):
        audit.record(r, "tool", "calculator", "ok" if i % 2 else "error", actor="telegram:42",
                     run_id=f"run_{i}", agent="ops", i=i)
    return clean_env(dict(os.environ), FERMIX_REDIS_URL=scratch_redis_url,
                     FERMIX_HOME=str(tmp_path))


def test_audit_tail_is_a_coloured_table_on_a_terminal_and_plain_lines_piped(
    env: dict[str, str],
) -> None:
    piped = fermix(env, "audit", "tail")
    assert piped.returncode == 0, piped.stderr
    assert [line.split("  ")[:5] for line in piped.stdout.splitlines()] == [
        [f"#{i + 1}", line.split("  ")[1], "tool", "calculator", "ok" if i % 2 else "error"]
        for i, line in enumerate(piped.stdout.splitlines())]
    assert "\x1b[" not in piped.stdout

    seen = fermix(env, "audit", "tail", tty="stdout")
    assert seen.returncode == 0, seen.stderr
    text = plain(seen.stdout)
    header = next(line for line in text.splitlines() if "SEQ" in line)
    assert header.split() == ["SEQ", "TIME", "KIND", "ACTION", "OUTCOME", "ACTOR", "WHERE",
                              "DETAIL"]
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("#")]
    assert [(row[0], row[4]) for row in rows] == [
        ("#1", "error"), ("#2", "ok"), ("#3", "error"), ("#4", "ok"), ("#5", "error")]
    assert f"{GREEN}ok" in seen.stdout  # an outcome is coloured

    no_colour = fermix({**env, "NO_COLOR": "1"}, "audit", "tail", tty="stdout")
    assert "SEQ" in no_colour.stdout and GREEN not in no_colour.stdout
    dumb = fermix({**env, "TERM": "dumb"}, "audit", "tail", tty="stdout")
    assert dumb.stdout == piped.stdout  # a dumb terminal gets the plain lines
    forced = fermix({**env, "FORCE_COLOR": "1"}, "audit", "tail")
    assert "SEQ" in plain(forced.stdout)  # FORCE_COLOR: a table even down a pipe


def test_json_is_one_document_whatever_the_terminal(env: dict[str, str], tmp_path: Path) -> None:
    tail = fermix(env, "audit", "tail", "--json", tty="stdout")
    assert [e["seq"] for e in json.loads(tail.stdout)] == [1, 2, 3, 4, 5]
    verified = json.loads(fermix(env, "audit", "verify", "--json").stdout)
    assert (verified["ok"], verified["count"], verified["first"], verified["last"]) == (
        True, 5, 1, 5)
    assert verified["message"].startswith("audit chain OK: 5 entries from #1 to #5")
    target = tmp_path / "out.jsonl"
    exported = fermix(env, "audit", "export", str(target), "--json")
    assert json.loads(exported.stdout) == {"file": str(target), "count": 5, "first": 1,
                                           "last": 5}
    target.write_text(target.read_text().replace('"calculator"', '"calculat0r"', 1))
    broken = fermix(env, "audit", "verify", "--file", str(target), "--json")
    assert broken.returncode == 1
    body = json.loads(broken.stdout)
    assert (body["ok"], body["broken"]["seq"], body["broken"]["problem"]) == (
        False, 1, "hash mismatch")
    assert broken.stderr.startswith("fermix: audit chain BROKEN at entry #1: hash mismatch")


@pytest.mark.parametrize("args", [("audit", "verify"), ("audit", "export", "{dir}/a.jsonl")],
                         ids=["verify", "export"])
def test_audit_progress_is_on_a_terminal_s_stderr_only(env: dict[str, str], tmp_path: Path,
                                                     args: tuple[str, ...]) -> None:
    argv = [a.format(dir=tmp_path) for a in args]
    piped = fermix(env, *argv)
    on_tty = fermix(env, *argv, tty="stderr")
    assert (piped.returncode, on_tty.returncode) == (0, 0), piped.stderr + on_tty.stderr
    assert piped.stderr == ""
    assert on_tty.stdout == piped.stdout  # the result itself is untouched
    assert f"{argv[0]} {argv[1]}:" in plain(on_tty.stderr)
    assert "5/5" in plain(on_tty.stderr)  # counted as it went


def test_doctor_is_a_table_with_its_progress_on_stderr(env: dict[str, str]) -> None:
    env = {**env, "FERMIX_PROVIDER": "openai", "FERMIX_MODEL": "m"}
    env.pop("OPENAI_API_KEY", None)
    piped = fermix(env, "doctor", "--live")
    assert piped.stderr == ""
    lines = piped.stdout.splitlines()
    assert lines[0].split()[:2] == ["ok", "config"]
    assert lines[-1].endswith(" ok.")

    on_tty = fermix(env, "doctor", "--live", tty="stderr")
    assert on_tty.stdout == piped.stdout.replace(_times(piped.stdout), _times(on_tty.stdout))
    said = plain(on_tty.stderr)
    assert "doctor: asking Redis" in said and "doctor: checking the provider routes" in said

    table = fermix(env, "doctor", tty="stdout")
    text = plain(table.stdout)
    assert next(line for line in text.splitlines() if "LEVEL" in line).split() == [
        "LEVEL", "CHECK", "FINDING"]
    assert any(line.split()[:2] == ["fail", "provider"] for line in text.splitlines())
    assert "\x1b[1;31mfail" in table.stdout  # a failure in bold red
    assert table.returncode == piped.returncode == 2


def _times(text: str) -> str:
    """The one part of doctor's lines that changes between runs: Redis's answer time."""
    return next(line for line in text.splitlines() if line.split()[1] == "redis")


def test_eval_counts_its_runs_on_a_terminal(tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text('[suite]\nname = "smoke"\n[[case]]\nname = "hello"\nmessage = "hi"\n'
                     '[case.expect]\ncontains = ["hi"]\n')
    env = clean_env(dict(os.environ), FERMIX_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
                    FERMIX_HOME=str(tmp_path))
    piped = fermix(env, "eval", str(suite), "--repeat", "3")
    assert piped.returncode == 1  # nothing ran: no gateway
    assert [line.split()[:2] for line in piped.stderr.splitlines()] == [["NOT", "RUN"]] * 3
    on_tty = fermix(env, "eval", str(suite), "--repeat", "3", tty="stderr")
    said = plain(on_tty.stderr)
    assert "eval smoke: 3 runs" in said and "3/3" in said
    assert said.count("NOT RUN hello") == 3  # each run's line stays above the bar
    assert on_tty.stdout == piped.stdout
    table = fermix(env, "eval", str(suite), "--repeat", "3", "--quiet", tty="stdout")
    rows = [line.split() for line in plain(table.stdout).splitlines()]
    assert ["Suite", "smoke:", "1", "cases", "×", "1", "column,", "3", "runs"] in rows
    assert ["CASE", "default"] in rows
    assert ["hello", "0/3", "not", "run", "$0.0000", "0.00", "s"] in rows
    assert "\x1b[1;33m0/3 not run" in table.stdout  # yellow: nothing ran
    assert " ".join(rows[-1]) == "0 of 3 runs passed; 1 of 1 cells below the pass rate 100%."
    as_json = fermix(env, "eval", str(suite), "--json", "-")
    report = json.loads(as_json.stdout)
    assert report["suite"] == "smoke" and as_json.returncode == 1


def test_agents_and_status_are_tables_on_a_terminal(served: tuple[str, RecordingCelery]
                                                    ) -> None:
    env = clean_env(dict(os.environ), FERMIX_GATEWAY_URL=served[0], FERMIX_API_TOKEN=TOKEN)
    piped = fermix(env, "agents", "list")
    assert piped.stdout.splitlines()[0] == "default (main): created, 0 active, 0 pending"
    listed = plain(fermix(env, "agents", "list", tty="stdout").stdout).splitlines()
    assert next(line for line in listed if "AGENT" in line).split() == [
        "AGENT", "ROLE", "MODEL", "STATE", "ACTIVE", "PENDING"]
    assert [line.split() for line in listed if line.split()[:1] == ["helper"]] == [
        ["helper", "sub", "created", "0", "0"]]

    shown = plain(fermix(env, "status", tty="stdout").stdout)
    status = [line.strip() for line in shown.splitlines()]
    assert status[0].startswith("workers seen: ")  # the summary, then the lists as tables
    assert "agents: 3" in status and "SKILL" in " ".join(status)
    assert json.loads(fermix(env, "status", "--json", tty="stdout").stdout)["agents"]


def test_actions_print_what_changed_as_json_and_their_sentence_otherwise(
    served: tuple[str, RecordingCelery],
) -> None:
    env = clean_env(dict(os.environ), FERMIX_GATEWAY_URL=served[0], FERMIX_API_TOKEN=TOKEN)
    paused = fermix(env, "agents", "pause", "ops", "--json", tty="stdout")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["name"] == "ops"
    resumed = fermix(env, "agents", "resume", "ops", "--json")
    body = json.loads(resumed.stdout)
    assert (body["name"], body["released"]) == ("ops", 0)
    again = fermix(env, "agents", "pause", "ops")
    assert again.stdout.startswith("Agent ops is paused: its messages queue")
    fermix(env, "agents", "resume", "ops")
