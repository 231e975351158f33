"""``fermix skills list | reload``: the real CLI against the scratch Redis and a FERMIX_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from fermix_dev.procs import free_port
from fermix_shared import keys


def fermix(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", "skills", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def test_list_shows_skills_and_files_not_loaded_and_reload_bumps_the_version(
    r: redis.Redis, scratch_redis_url: str, tmp_path: Path
) -> None:
    good = tmp_path / "skills" / "triage" / "SKILL.md"
    good.parent.mkdir(parents=True)
    good.write_text("---\nname: triage\ndescription: Sort the inbox.\n---\nSort it.\n")
    bad = tmp_path / "plugins" / "p" / "skills" / "bad" / "SKILL.md"
    bad.parent.mkdir(parents=True)
    bad.write_text("---\nname: bad\n---\nx\n")
    env = {**os.environ, "FERMIX_REDIS_URL": scratch_redis_url, "FERMIX_HOME": str(tmp_path)}

    out = fermix(env, "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "triage  operator  home  Sort the inbox."
    assert lines[1].startswith("write-a-skill  operator  bundled  ")
    assert lines[2:] == ["", "Not loaded (1):", f"  {bad} (plugin): description is required"]
    listed = json.loads(fermix(env, "list", "--json").stdout)
    assert [s["name"] for s in listed["skills"]] == ["triage", "write-a-skill"]
    assert listed["version"] == "0" and listed["issues"][0]["source"] == str(bad)

    reload = fermix(env, "reload")
    assert reload.returncode == 0, reload.stderr
    assert reload.stdout.startswith("Skill registry version 1: every worker rescans")
    assert r.get(keys.skills_version()) == "1"


def test_an_unreachable_redis_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    env = {**os.environ, "FERMIX_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "FERMIX_HOME": str(tmp_path)}
    out = fermix(env, "reload")
    assert out.returncode == 1 and out.stderr.startswith("fermix: cannot reach Redis")
