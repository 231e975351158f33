"""Fermix as a fleet of hosts (network namespaces, :mod:`tests.netns`): Redis and the scripted
model on one host, every gateway, worker and beat on its own, each reached by its address.

:class:`HostFleet` starts and restarts the parts; the test process talks to the gateways over
the bridge like any client. Worker node names are ``<host>-g<generation>`` so a run's
``worker`` field says which host ran it (:meth:`HostFleet.host_of`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from fermix_dev.procs import Managed, redis_server_binary, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_shared import keys
from tests.netns import Host, Network

TOKEN = "netns-fleet-token"
GATEWAY_PORT = 8080
REDIS_PORT = 6379


@dataclass
class Part:
    """One running part: what it is, where, and its process."""

    kind: str  # gateway, worker, beat
    host: Host
    proc: Managed
    node: str = ""  # a worker's Celery node name (without @hostname)


@dataclass
class HostFleet:
    net: Network
    logs: Path
    env: dict[str, str]
    redis_host: Host
    parts: list[Part] = field(default_factory=list)
    _generation: dict[str, int] = field(default_factory=dict)

    @property
    def redis_url(self) -> str:
        return f"redis://{self.redis_host.addr}:{REDIS_PORT}/0"

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def of(self, kind: str) -> list[Part]:
        return [p for p in self.parts if p.kind == kind and p.proc.proc.poll() is None]

    def gateway_urls(self) -> list[str]:
        return [f"http://{p.host.addr}:{GATEWAY_PORT}" for p in self.of("gateway")]

    def http(self, url: str) -> httpx.Client:
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=30, trust_env=False)

    def host_of(self, worker: str) -> str:
        """The host a run's ``worker`` field (``w2-g1@box:pid:nonce``) names."""
        return worker.split("@", 1)[0].rsplit("-g", 1)[0]

    def _spawn(self, host: Host, name: str, argv: list[str], env: dict[str, str] | None = None) -> Managed:
        return self.net.spawn(host, name, argv, env or self.env_for(host), self.logs / f"{name}.log")

    def env_for(self, host: Host) -> dict[str, str]:
        return {**self.env, "FERMIX_HOME": str(self.logs / "home" / host.name)}

    # -- parts ---------------------------------------------------------------------------

    def start_redis(self) -> None:
        data = self.logs / "redis-data"
        data.mkdir(parents=True, exist_ok=True)
        proc = self._spawn(self.redis_host, "redis", [
            redis_server_binary(), "--port", str(REDIS_PORT), "--bind", self.redis_host.addr,
            "--dir", str(data), "--appendonly", "no", "--save", "", "--protected-mode", "no"])
        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=1)
        wait_until(lambda: bool(client.ping()), 15, "redis-server", proc.proc)
        client.close()

    def spawn(self, kind: str, host: Host, slots: int = 4) -> Part:
        """Start a ``gateway``, ``worker`` (of ``slots`` slots) or ``beat`` on ``host``."""
        if kind == "worker":
            return self.spawn_worker(host, slots)
        return {"gateway": self.spawn_gateway, "beat": self.spawn_beat}[kind](host)

    def spawn_gateway(self, host: Host) -> Part:
        name = self._next_name(host)
        proc = self._spawn(host, name, [sys.executable, "-m", "fermix_cli", "gateway",
                                        "--host", host.addr, "--port", str(GATEWAY_PORT)])
        part = Part("gateway", host, proc)
        self.parts.append(part)
        return part

    def spawn_worker(self, host: Host, slots: int) -> Part:
        node = self._next_name(host)
        proc = self._spawn(host, node, [sys.executable, "-m", "fermix_cli", "worker",
                                        "--concurrency", str(slots), "--name", f"{node}@%h",
                                        "--log-level", "INFO"])
        part = Part("worker", host, proc, node)
        self.parts.append(part)
        return part

    def spawn_beat(self, host: Host) -> Part:
        name = self._next_name(host)
        proc = self._spawn(host, name, [sys.executable, "-m", "fermix_cli", "beat",
                                        "--log-level", "INFO"])
        part = Part("beat", host, proc)
        self.parts.append(part)
        return part

    def _next_name(self, host: Host) -> str:
        self._generation[host.name] = self._generation.get(host.name, 0) + 1
        return f"{host.name}-g{self._generation[host.name]}"

    def wait_ready(self, part: Part, timeout: float = 60) -> None:
        """A gateway answers /healthz on its address; a worker's heartbeat is in Redis
        (written on worker_ready); a beat has logged its start (one of two then holds the
        lock, the other stands by: see :meth:`lock_holder`)."""
        if part.kind == "gateway":
            url = f"http://{part.host.addr}:{GATEWAY_PORT}/healthz"
            wait_until(lambda: httpx.get(url, timeout=1, trust_env=False).status_code == 200,
                       timeout, part.proc.name, part.proc.proc)
        elif part.kind == "worker":
            r = self.redis()
            started = part.proc.started_at

            def beating() -> bool:
                beats: dict[str, str] = r.hgetall(keys.workers())  # type: ignore[assignment]
                return any(k.startswith(f"{part.node}@") and float(v) >= started
                           for k, v in beats.items())

            wait_until(beating, timeout, part.proc.name, part.proc.proc)
        else:
            log = part.proc.log_path
            assert log is not None
            wait_until(lambda: "beat: Starting..." in log.read_text(), timeout, part.proc.name,
                       part.proc.proc)

    def lock_holder(self) -> Part | None:
        """The running beat whose log says it holds RedBeat's lock (and never released it)."""
        for beat in self.of("beat"):
            log = beat.proc.log_path.read_text() if beat.proc.log_path else ""
            if "beat: Acquired lock" in log and "beat: Releasing lock" not in log:
                return beat
        return None

    def worker_on(self, host_name: str) -> Part:
        return next(p for p in self.of("worker") if p.host.name == host_name)

    # -- restarts ------------------------------------------------------------------------

    def restart(self, old: Part, slots: int = 4) -> tuple[float, float]:
        """SIGTERM ``old``, wait for it to exit, start its successor on the same host and wait
        until that is ready. Returns the seconds from SIGTERM to the exit, and from the exit to
        the successor being ready."""
        at = time.monotonic()
        old.proc.kill(signal.SIGTERM)
        rc = old.proc.proc.wait(30)
        exited = time.monotonic()
        # A worker exits 0 (its turns finished or handed over); uvicorn re-raises SIGTERM after
        # draining; Celery beat exits 0, or 1 when the signal lands mid-tick (that tick is
        # lost, the next one fires its jobs).
        ok = {"worker": (0,), "gateway": (-signal.SIGTERM,), "beat": (0, 1)}[old.kind]
        assert rc in ok, f"{old.proc.name} exited with {rc}"
        self.parts.remove(old)
        self.wait_ready(self.spawn(old.kind, old.host, slots))
        return exited - at, time.monotonic() - exited


def start_llm(net: Network, host: Host) -> ScriptedLLMServer:
    """The scripted model, in this process, listening on ``host``'s address (its socket is
    made inside that namespace), so the script and the recorded requests stay in reach."""
    return net.inside(host, lambda: ScriptedLLMServer(host.addr).start())


def base_env(llm: ScriptedLLMServer, redis_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ, "PYTHONUNBUFFERED": "1", "FERMIX_REDIS_URL": redis_url,
        "FERMIX_API_TOKEN": TOKEN, "FERMIX_PROVIDER": "openai", "FERMIX_MODEL": "scripted-openai",
        "OPENAI_BASE_URL": llm.openai_base_url, "OPENAI_API_KEY": "test-key",
        # No proxy may stand between the hosts.
        "NO_PROXY": "*", "no_proxy": "*", **extra,
    }
