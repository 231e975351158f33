"""The README's run command: `fermix dev` on embedded defaults (no Redis URL, no API key)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fermix_dev.procs import free_port


def test_fermix_dev_brings_the_stack_up_and_a_turn_answers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FERMIX_REDIS_URL"}
    env["FERMIX_HOME"] = str(tmp_path / "home")
    proc = subprocess.run(
        [sys.executable, "-m", "fermix_cli", "dev", "--check", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "embedded Redis (AOF on)" in out
    assert "using the BUILT-IN SCRIPTED MODEL" in out
    assert """smoke turn answered: 'Scripted reply: you said "hello"'""" in out
    # The embedded Redis kept its data on disk (append-only file) under FERMIX_HOME.
    assert any((tmp_path / "home" / "dev" / "redis").rglob("*.aof*"))


def test_fermix_dev_refuses_a_busy_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "fermix_cli", "dev", "--check", "--port", str(port)],
            env={**os.environ, "FERMIX_HOME": str(tmp_path)}, capture_output=True, text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert f"port {port} is already in use" in proc.stderr
