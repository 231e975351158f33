"""``fermix completion bash|zsh|fish``: the printed script, sourced in a real bash, completes
commands and subcommands by asking a real ``fermix`` process (argcomplete's protocol)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = str(Path(sys.executable).parent)  # where `fermix` is installed, as on a user's PATH


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def fermix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", *args], env=_env(),
                          capture_output=True, text=True, timeout=60)


def bash_completes(line: str) -> list[str]:
    """What bash offers for ``line`` (the cursor at its end) with the script sourced."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    script = (
        'eval "$(fermix completion bash)"\n'
        f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; COMP_TYPE=9\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        f"_python_argcomplete fermix {words[-1]!r} {words[-2]!r}\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands_subcommands_and_flags() -> None:
    assert bash_completes("fermix ag") == ["agent", "agents"]
    assert set(bash_completes("fermix agents ")) >= {"list", "pause", "resume", "kill"}
    assert bash_completes("fermix audit ve") == ["verify"]
    assert bash_completes("fermix tokens create --role ") == ["viewer", "operator", "admin"]
    assert bash_completes("fermix completion ") == ["-h", "--help", "bash", "zsh", "fish"]


def test_the_protocol_answers_from_a_real_fermix_process(tmp_path: Path) -> None:
    answer = tmp_path / "answer"
    line = "fermix sch"
    done = subprocess.run(
        [sys.executable, "-m", "fermix_cli"], capture_output=True, text=True, timeout=60,
        env={**_env(), "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
             "_ARGCOMPLETE_STDOUT_FILENAME": str(answer), "_ARGCOMPLETE_IFS": "\n"})
    assert done.returncode == 0, done.stderr
    assert answer.read_text().split() == ["schedule"]
    assert done.stdout == ""  # nothing ran


@pytest.mark.parametrize(("shell", "registers"), [
    ("bash", "complete -o nospace -o default -o bashdefault -F _python_argcomplete fermix"),
    ("zsh", "compdef _python_argcomplete fermix"),
    ("fish", "complete --command fermix"),
])
def test_each_shell_gets_its_script(shell: str, registers: str) -> None:
    out = fermix("completion", shell)
    assert out.returncode == 0, out.stderr
    assert registers in out.stdout
    if shutil.which(shell) and shell != "fish":
        checked = subprocess.run([shell, "-n"], input=out.stdout, text=True,
                                 capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr  # it parses


def test_another_shell_is_one_sentence_and_exit_2() -> None:
    out = fermix("completion", "tcsh")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("fermix: there is no completion for the shell 'tcsh'; "
                          "`fermix completion` knows bash, zsh and fish\n")
