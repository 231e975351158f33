"""docker-compose.yml is valid, every Fermix command in it is one our CLI accepts, and it ships
no open API and no default password."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fermix_cli.main import build_parser
from fermix_shared.logs import secret_values
from fermix_shared.metrics import FLEET_GAUGES
from fermix_shared.settings import Settings

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


def test_the_image_installs_the_lock_then_fermix_without_resolving_again() -> None:
    """The releases CI tested (requirements/runtime.txt, hashes checked), not whatever is
    newest on the day the image is built; Fermix itself adds no dependency on top."""
    steps = [line for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
             if line.startswith(("COPY", "RUN pip"))]
    lock = steps.index("RUN pip install --no-cache-dir -r requirements/runtime.txt")
    assert steps[lock - 1] == "COPY requirements/runtime.txt ./requirements/runtime.txt"
    assert steps[-1].startswith("RUN pip install --no-cache-dir --no-deps . ")
    assert all("pip install" not in s or s.startswith(("RUN pip install --no-cache-dir -r",
               "RUN pip install --no-cache-dir --no-deps")) for s in steps)


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


# -- deploy/kubernetes and deploy/systemd ---------------------------------------------------

K8S = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
# Read by the SDKs or by Flower, not by our settings; FERMIX_WORKER_NICE by `fermix worker`.
OTHER_ENV = {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
             "FLOWER_BASIC_AUTH", "FERMIX_WORKER_NICE", "FERMIX_CONFIG",
             "FERMIX_GATEWAY_PROCESSES"}


def manifests() -> list[dict[str, Any]]:
    docs = [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    assert docs and all(isinstance(d, dict) and {"apiVersion", "kind", "metadata"} <= set(d)
                        for d in docs)
    return docs


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def container(name: str) -> dict[str, Any]:
    (c,) = of_kind("Deployment")[name]["spec"]["template"]["spec"]["containers"]
    return dict(c)


def mebibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert match, f"memory quantity {quantity!r} is not in Mi or Gi"
    return int(match[1]) * (1024 if match[2] == "Gi" else 1)


def known_env(name: str) -> bool:
    if name in OTHER_ENV:
        return True
    field = name.removeprefix("FERMIX_").split("__")[0].lower()
    return name.startswith("FERMIX_") and field in Settings.model_fields


def test_every_role_has_a_deployment_with_resources_and_a_real_command() -> None:
    deployments = of_kind("Deployment")
    assert set(deployments) == {"fermix-gateway", "fermix-worker", "fermix-beat", "fermix-flower"}
    roles = {}
    for name in deployments:
        c = container(name)
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, kind)
        if c["command"][0] == "fermix":
            roles[name] = build_parser().parse_args(c["command"][1:]).command
    assert roles == {"fermix-gateway": "gateway", "fermix-worker": "worker", "fermix-beat": "beat"}
    for name in ("fermix-gateway", "fermix-worker", "fermix-flower"):
        assert {"readinessProbe", "livenessProbe"} <= set(container(name)), name
    gateway = container("fermix-gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Sized from benchmarks/RESULTS.md: ~230-300 MB with 1,000 turns in flight, gateway ~90 MB.
    assert mebibytes(container("fermix-worker")["resources"]["limits"]["memory"]) >= 400
    assert mebibytes(gateway["resources"]["limits"]["memory"]) >= 192


def test_workers_drain_beat_stands_by_and_disruptions_are_bounded() -> None:
    deployments = of_kind("Deployment")
    grace = deployments["fermix-worker"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert grace >= 30 and grace > Settings().worker_shutdown_grace
    assert deployments["fermix-beat"]["spec"]["replicas"] == 2
    pdbs = {d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
            for d in of_kind("PodDisruptionBudget").values()}
    assert pdbs == {"fermix-gateway", "fermix-worker"}
    (svc,) = [s for s in of_kind("Service").values()
              if s["spec"]["selector"] == {"app.kubernetes.io/name": "fermix-gateway"}]
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    (scaler,) = of_kind("ScaledObject").values()
    assert scaler["spec"]["scaleTargetRef"]["name"] == "fermix-worker"
    (trigger,) = scaler["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    # It scales on a gauge the gateway exports, aggregated as the fleet-wide value it is.
    assert trigger["metadata"]["query"] == "max(fermix_dispatch_queue_length)"
    assert "fermix_dispatch_queue_length" in dict(FLEET_GAUGES)


def test_manifests_commit_no_secret_and_name_only_known_settings() -> None:
    names: set[str] = set()
    for d in manifests():
        if d["kind"] == "Secret":
            assert set(d["stringData"].values()) == {""}, d["metadata"]["name"]
            names |= set(d["stringData"])
        if d["kind"] == "ConfigMap":
            names |= set(d["data"])
    for name in of_kind("Deployment"):
        names |= {e["name"] for e in container(name).get("env", [])}
    assert names and [n for n in names if not known_env(n)] == []
    assert "FERMIX_API_TOKEN" in names and "FERMIX_LOG_FORMAT" in names
    # Flower's password comes from its Secret, and an empty one stops it from starting.
    flower = container("fermix-flower")
    (auth,) = [e for e in flower["env"] if e["name"] == "FLOWER_BASIC_AUTH"]
    assert auth["valueFrom"]["secretKeyRef"]["name"] == "fermix-flower"
    assert 'test -n "$FLOWER_BASIC_AUTH" ||' in flower["command"][-1]


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep the keys' case
    parser.read_string((SYSTEMD / name).read_text())
    return parser


@pytest.mark.parametrize(("name", "role"), [("fermix-gateway.service", "gateway"),
                                            ("fermix-worker@.service", "worker"),
                                            ("fermix-beat.service", "beat")])
def test_systemd_units_run_real_commands_and_restart(name: str, role: str) -> None:
    service = unit(name)["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "fermix"
    args = build_parser().parse_args(argv[1:])
    assert args.command == role
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert service["EnvironmentFile"] == "/etc/fermix/fermix.env"
    if role == "worker":
        assert args.nice == 10 and "%i" in args.name
        assert int(service["TimeoutStopSec"]) > Settings().worker_shutdown_grace
        assert service["KillMode"] == "mixed"


def test_systemd_env_file_names_only_known_settings_and_no_secret() -> None:
    lines = (SYSTEMD / "fermix.env.example").read_text().splitlines()
    pairs = dict(ln.lstrip("# ").split("=", 1) for ln in lines if re.match(r"#? ?[A-Z_]+=", ln))
    assert pairs and [k for k in pairs if not known_env(k)] == []
    secrets = secret_values(None, pairs)
    assert secrets == set(), secrets
