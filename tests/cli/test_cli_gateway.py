"""Secure by default: ``fermix gateway`` and ``fermix dev`` never serve the operator API
(``/v1/*``) beyond this machine without ``FERMIX_API_TOKEN``.

The refusals run the real CLI and must exit before anything binds. The one gateway that does
bind a wildcard address has a token, and the test only ever talks to it over 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fermix_cli.main import is_loopback
from fermix_dev.procs import Managed, free_port, wait_until


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FERMIX_API_TOKEN"}
    return {**env, **extra}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("LocalHost", True), ("0.0.0.0", False), ("::", False),
     ("10.1.2.3", False), ("192.168.0.7", False), ("gateway.example", False), ("", False)],
)
def test_loopback_is_127_0_0_0_8_ipv6_one_and_localhost(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    "argv",
    [["gateway", "--host", "0.0.0.0"], ["gateway", "--host", "::"],
     ["gateway", "--host", "10.1.2.3"], ["dev", "--check", "--host", "0.0.0.0"]],
    ids=["gateway-any-ipv4", "gateway-any-ipv6", "gateway-lan", "dev-any-ipv4"],
)
def test_a_public_address_without_a_token_is_refused(argv: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fermix_cli", *argv, "--port", str(free_port())],
        env=cli_env(FERMIX_HOME=str(tmp_path), FERMIX_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"),
        capture_output=True, text=True, timeout=20,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"fermix: refusing to serve the API on {argv[argv.index('--host') + 1]} "
                           "without a token: set FERMIX_API_TOKEN"), line
    assert not (tmp_path / "dev").exists(), "fermix dev started something before refusing"


def test_with_a_token_the_gateway_binds_a_public_address(
    redis_url: str, logs_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = cli_env(FERMIX_API_TOKEN="s3cret", FERMIX_HOME=str(tmp_path),
                  FERMIX_REDIS_URL=redis_url.rsplit("/", 1)[0] + "/14", PYTHONUNBUFFERED="1")
    gw = Managed("public-gateway",
                 [sys.executable, "-m", "fermix_cli", "gateway", "--host", "0.0.0.0",
                  "--port", str(port)],
                 env=env, log_path=logs_dir / "public-gateway.log")
    try:
        local = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{local}/healthz", timeout=1).status_code == 200,
                   30, "gateway", gw.proc)
        assert httpx.get(f"{local}/v1/status", timeout=5).status_code == 401
        ok = httpx.get(f"{local}/v1/status", headers={"Authorization": "Bearer s3cret"}, timeout=5)
        assert ok.status_code == 200
    finally:
        gw.stop()
