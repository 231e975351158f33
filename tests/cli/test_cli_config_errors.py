"""A configuration mistake stops a command with one sentence and exit code 2, naming the field
and the reason (or, for a key no setting reads, the nearest known key), never a traceback and
never the value given (it may be a secret). The commands that exec Celery (``worker``,
``beat``) check before they exec, so the sentence is Fermix's, not Celery's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def fermix(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FERMIX_")}
    return subprocess.run([sys.executable, "-m", "fermix_cli", *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [["worker"], ["beat"], ["gateway", "--port", "9"]])
def test_a_bad_value_is_one_sentence_and_exit_2(tmp_path: Path, command: list[str]) -> None:
    done = fermix({"FERMIX_HOME": str(tmp_path), "FERMIX_MAX_TOKENS": "s3cr3t-not-a-number"},
                  *command)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "fermix: the settings do not validate: max_tokens: Input should be a valid integer, "
        "unable to parse string as an integer (correct them in the file FERMIX_CONFIG names, "
        "or their FERMIX_* variables; `fermix doctor` checks them)"]
    assert "s3cr3t" not in done.stdout + done.stderr


def test_an_unknown_key_in_the_file_names_the_nearest_one_and_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "fermix.toml"
    cfg.write_text('[limits]\nmax_text_char = 5\n')
    done = fermix({"FERMIX_HOME": str(tmp_path), "FERMIX_CONFIG": str(cfg)}, "worker")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"fermix: {cfg}: unknown key 'limits.max_text_char' (did you mean "
        "'limits.max_text_chars'?); docs/configuration.md lists every key"]
