"""docker-compose.yml is valid, every Fermix command in it is one our CLI accepts, and it ships
no open API and no default password."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from fermix_cli.main import build_parser

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


def test_compose_requires_an_api_token_and_a_flower_password() -> None:
    # Both services are published on the host's ports: `${VAR:?message}` makes compose refuse
    # to start without them, and no password ships in the file.
    text = (ROOT / "docker-compose.yml").read_text()
    env = compose()["x-fermix"]["environment"]
    assert re.fullmatch(r"\$\{FERMIX_API_TOKEN:\?[^}]*FERMIX_API_TOKEN[^}]*\}", env["FERMIX_API_TOKEN"])
    (auth,) = [a for a in compose()["services"]["flower"]["command"] if a.startswith("--basic-auth=")]
    assert re.fullmatch(r"--basic-auth=\$\{FLOWER_USER:-\w+\}:"
                        r"\$\{FLOWER_PASSWORD:\?[^}]*FLOWER_PASSWORD[^}]*\}", auth), auth
    # No fallback value for either anywhere (`:-x`, `-x` or a literal).
    for var in ("FERMIX_API_TOKEN", "FLOWER_PASSWORD"):
        uses = re.findall(r"\$\{" + var + r"([^}]*)\}", text)
        assert uses and all(u.startswith(":?") for u in uses), (var, uses)
    assert "change-me" not in text


def test_the_image_copies_every_package_the_project_installs() -> None:
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M))
    assert packages == copied


def _docker_compose(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60, env=env)
    if "is not a docker command" in proc.stderr or "unknown" in proc.stderr.lower():
        pytest.skip("docker compose plugin not installed")
    return proc


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")
def test_docker_compose_config_accepts_the_file() -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("FERMIX_API_TOKEN", "FLOWER_PASSWORD")}
    proc = _docker_compose({**base, "FERMIX_API_TOKEN": "t0k", "FLOWER_PASSWORD": "pw"})
    assert proc.returncode == 0, proc.stderr
    refused = _docker_compose({**base, "FLOWER_PASSWORD": "pw"})
    assert refused.returncode != 0 and "FERMIX_API_TOKEN" in refused.stderr
