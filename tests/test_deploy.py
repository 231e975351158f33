"""docker-compose.yml is valid and every Fermix command in it is one our CLI accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fermix_shared.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_whole_fleet() -> None:
    services = compose()["services"]
    assert {"redis", "gateway", "worker", "beat", "flower"} <= set(services)
    assert "--appendonly" in services["redis"]["command"], "accepted messages need Redis AOF"


@pytest.mark.parametrize("service", ["gateway", "worker", "beat"])
def test_compose_commands_match_the_cli(service: str) -> None:
    cmd = compose()["services"][service]["command"]
    assert cmd[0] == "fermix"
    args = build_parser().parse_args(cmd[1:])
    assert args.command == service


def test_flower_uses_our_celery_app() -> None:
    cmd = compose()["services"]["flower"]["command"]
    assert cmd[:3] == ["celery", "-A", "fermix_shared.celery_app:app"] and "flower" in cmd


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")
def test_docker_compose_config_accepts_the_file() -> None:
    proc = subprocess.run(["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60)
    if "is not a docker command" in proc.stderr or "unknown" in proc.stderr.lower():
        pytest.skip("docker compose plugin not installed")
    assert proc.returncode == 0, proc.stderr
