"""Separate hosts on one machine: Linux network namespaces joined by a bridge.

A :class:`Network` is a private /24 (random in 10/8, 172.16/12 or 192.168/16, overlapping no
route here) on a bridge that lives in its own "switch" namespace, so the root namespace's interfaces are untouched but for one veth
(``fx<tag>``) that lets the test process reach the hosts. Each :class:`Host` is a namespace
with one veth (``eth0``) into the switch and its own address; programs run in it with
``ip netns exec`` (which execs them: the :class:`~fermix_dev.procs.Managed` pid is the
program's). :meth:`Network.cut` / :meth:`Network.mend` set a host's link down and up (a
partition: its packets are dropped, its connections stall, nothing is reset).

Everything is named ``fx-<6 hex>-*`` and removed by :meth:`Network.destroy` (processes by
pid, then the namespaces, which takes their veths along). Needs root and ``ip``;
:func:`unavailable` says why not when they are missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fermix_dev.procs import Managed, stop_all

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class NetnsError(RuntimeError):
    """An ``ip`` command failed (the message carries its stderr)."""


def ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can: root, ``ip``, ``netns``)."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    probe = f"fx-{secrets.token_hex(3)}-probe"
    try:
        ip("netns", "add", probe)
    except (NetnsError, OSError) as e:
        return f"cannot create a network namespace: {e}"
    with contextlib.suppress(NetnsError):
        ip("netns", "del", probe)
    return None


def _routed() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine routes (``default`` as 0.0.0.0/0 is left out: it
    overlaps everything and means nothing here)."""
    nets = []
    for line in ip("-4", "route", "show", "table", "all").splitlines():
        word = line.split(" ", 1)[0]
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(word, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                nets.append(net)
    return nets


@dataclass
class Host:
    """One namespace: ``name`` (its role, e.g. ``w1``), ``ns``, ``addr`` on the subnet."""

    name: str
    ns: str
    addr: str
    procs: list[Managed] = field(default_factory=list)

    @property
    def dev(self) -> str:
        return "eth0"


class Network:
    """A bridge in a switch namespace, hosts around it, and the root namespace on it too."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        used = _routed()
        # A private /24 no route here overlaps (a VPN's 10.0.0.0/8 rules all of 10/8 out).
        for _ in range(300):
            head = secrets.choice([f"10.{secrets.randbelow(200) + 50}",
                                   f"172.{16 + secrets.randbelow(16)}", "192.168"])
            candidate = ipaddress.IPv4Network(f"{head}.{secrets.randbelow(250) + 1}.0/24")
            if not any(candidate.overlaps(net) for net in used):
                break
        else:
            raise NetnsError("no private /24 is free of this machine's routes")
        self.prefix = str(candidate.network_address).rsplit(".", 1)[0]
        self.switch = f"fx-{self.tag}-sw"
        self.root_dev = f"fx{self.tag}"
        self.root_addr = f"{self.prefix}.1"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []

    def create(self) -> Network:
        """The switch namespace with its bridge, and the root namespace's port on it."""
        self._add_ns(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        ip("link", "add", self.root_dev, "type", "veth", "peer", "name", "root",
           "netns", self.switch)
        self._plug("root")
        ip("addr", "add", f"{self.root_addr}/24", "dev", self.root_dev)
        ip("link", "set", self.root_dev, "up")
        return self

    def add_host(self, name: str) -> Host:
        """A namespace ``fx-<tag>-<name>`` with ``eth0`` on the bridge and the next address."""
        host = Host(name, f"fx-{self.tag}-{name}", f"{self.prefix}.{10 + len(self.hosts)}")
        self._add_ns(host.ns)
        ip("-n", host.ns, "link", "set", "lo", "up")
        ip("-n", host.ns, "link", "add", host.dev, "type", "veth", "peer", "name", f"p-{name}",
           "netns", self.switch)
        self._plug(f"p-{name}")
        ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", host.dev)
        ip("-n", host.ns, "link", "set", host.dev, "up")
        self.hosts[name] = host
        return host

    def _add_ns(self, ns: str) -> None:
        ip("netns", "add", ns)
        self._namespaces.append(ns)

    def _plug(self, port: str) -> None:
        ip("-n", self.switch, "link", "set", "dev", port, "master", "br0")
        ip("-n", self.switch, "link", "set", "dev", port, "up")

    def cut(self, host: Host) -> None:
        """Set the host's link down from inside its namespace: a partition."""
        ip("-n", host.ns, "link", "set", host.dev, "down")

    def mend(self, host: Host) -> None:
        ip("-n", host.ns, "link", "set", host.dev, "up")

    def spawn(self, host: Host, name: str, argv: Sequence[str], env: dict[str, str],
              log_path: Path) -> Managed:
        """Start ``argv`` on ``host`` (``ip netns exec``, its own process group)."""
        proc = Managed(name, ["ip", "netns", "exec", host.ns, *argv], env=env, log_path=log_path)
        host.procs.append(proc)
        return proc

    def inside(self, host: Host, fn: Callable[[], T]) -> T:
        """Call ``fn`` in a thread that has entered ``host``'s namespace: sockets it creates
        live there (an in-process server bound there keeps serving from any thread)."""
        result: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/var/run/netns/{host.ns}", os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {host.ns} failed")
                finally:
                    os.close(fd)
                result.append(fn())
            except BaseException as e:  # handed to the caller's thread
                error.append(e)

        # The thread ends in the namespace; threads it started stay there, no one else is.
        t = threading.Thread(target=run, name=f"netns-{host.name}", daemon=True)
        t.start()
        t.join()
        if error:
            raise error[0]
        return result[0]

    def stop_processes(self) -> None:
        stop_all([p for h in self.hosts.values() for p in h.procs])

    def destroy(self) -> None:
        """Kill every process started on a host (by pid), delete the namespaces (their veths
        go with them) and the root namespace's port. Safe to call twice, or half-built."""
        self.stop_processes()
        for ns in reversed(self._namespaces):
            with contextlib.suppress(NetnsError):
                ip("netns", "del", ns)
        self._namespaces.clear()
        with contextlib.suppress(NetnsError):
            ip("link", "del", self.root_dev)  # gone already with its peer, normally
