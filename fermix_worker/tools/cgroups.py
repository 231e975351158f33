"""Per-command cgroups: the memory and the process count of a whole ``run_command``.

Resource limits (``setrlimit``) are per process (``RLIMIT_AS``) or per user (``RLIMIT_NPROC``,
which root ignores): three 2 GB processes all fit a 4 GB address-space limit. A cgroup binds
every process of the command together, and tmpfs pages it writes (bwrap's ``/tmp``) count
against its memory too. Each command gets a cgroup of its own, created before it starts (the
child joins it between fork and exec, so nothing it starts escapes), killed and removed when it
ends.

Where (per controller, ``memory`` and ``pids``; probed once per process, :func:`support`):

- cgroup v2: in ``command_cgroup`` when set (a directory whose ``cgroup.subtree_control``
  lists ``memory`` and ``pids``, writable by the worker), else in the worker's own cgroup when
  that already delegates the controller to its children; limits ``memory.max`` (and
  ``memory.swap.max`` = 0), ``pids.max``;
- cgroup v1: under the worker's own cgroup in the controller's hierarchy (e.g.
  ``/sys/fs/cgroup/memory/<own>/fermix-cmd-...``); limits ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``), ``pids.max``;
- neither writable: per-process limits only; the worker says so at start (a WARNING), in
  ``fermix doctor`` and in ``/v1/status``.

When the memory limit is reached the kernel kills a process of the command (the largest);
when the process limit is reached ``fork`` fails with EAGAIN. The tool's result says either.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

ControllerName = Literal["memory", "pids"]
CONTROLLERS: tuple[ControllerName, ...] = ("memory", "pids")
PREFIX = "fermix-cmd-"
# How long remove() waits for the killed processes to leave the cgroup.
REMOVE_WAIT_S = 1.0


@dataclass(frozen=True)
class Controller:
    """Where a command's cgroup for one controller is made: in ``parent``, cgroup ``version``."""

    name: ControllerName
    version: Literal[1, 2]
    parent: Path


@dataclass(frozen=True)
class Support:
    """What this host lets the worker bind per command; ``problems`` say why a controller is
    missing."""

    memory: Controller | None
    pids: Controller | None
    problems: tuple[str, ...] = ()

    def controllers(self) -> list[Controller]:
        return [c for c in (self.memory, self.pids) if c is not None]

    def describe(self) -> str:
        """One line: what binds the whole command, and what does not."""
        parts = []
        for name in CONTROLLERS:
            c: Controller | None = getattr(self, name)
            parts.append(f"{name}: cgroup v{c.version} ({c.parent})" if c else
                         f"{name}: per process only")
        return "; ".join(parts)


def _mounts() -> tuple[dict[str, Path], Path | None]:
    """cgroup v1 mount points by controller, and the cgroup2 mount point."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            point = Path(fields[4])
            if tail[0] == "cgroup2" and v2 is None:
                v2 = point
            elif tail[0] == "cgroup":
                for option in tail[2].split(","):
                    v1.setdefault(option, point)
    return v1, v2


def _own_paths() -> tuple[dict[str, str], str | None]:
    """This process's cgroup path per v1 controller, and its v2 path."""
    v1: dict[str, str] = {}
    v2: str | None = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            number, names, path = line.split(":", 2)
            if number == "0" and names == "":
                v2 = path
            for name in names.split(","):
                v1[name] = path
    return v1, v2


def _usable(parent: Path, name: ControllerName, version: int) -> str | None:
    """Why a command's cgroup cannot be made in ``parent`` (None: it can; probed for real)."""
    probe = parent / f"{PREFIX}probe-{os.getpid()}"
    limit = "memory.max" if version == 2 and name == "memory" else (
        "memory.limit_in_bytes" if name == "memory" else "pids.max")
    try:
        probe.mkdir()
    except OSError as e:
        return f"{name}: cannot create a cgroup in {parent}: {e.strerror or e}"
    try:
        (probe / limit).write_text("max" if name == "pids" or version == 2 else "-1")
    except OSError as e:
        return f"{name}: cannot set {limit} in {parent}: {e.strerror or e}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None


def _delegates(folder: Path, name: str) -> bool:
    try:
        return name in (folder / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _detect(explicit: Path | None) -> Support:
    mounts_v1, mount_v2 = _mounts()
    own_v1, own_v2 = _own_paths()
    found: dict[str, Controller] = {}
    problems: list[str] = []
    for name in CONTROLLERS:
        candidates: list[tuple[int, Path]] = []
        if explicit is not None:
            if _delegates(explicit, name):
                candidates.append((2, explicit))
            else:
                problems.append(f"{name}: {explicit} does not delegate it "
                                f"(its cgroup.subtree_control lacks {name})")
        elif mount_v2 is not None and own_v2 is not None:
            own = mount_v2 / own_v2.lstrip("/")
            if _delegates(own, name):
                candidates.append((2, own))
        if explicit is None and name in mounts_v1 and name in own_v1:
            candidates.append((1, mounts_v1[name] / own_v1[name].lstrip("/")))
        if not candidates and explicit is None:
            problems.append(f"{name}: no cgroup v1 hierarchy and the worker's cgroup v2 does "
                            "not delegate it")
        for version, parent in candidates:
            why = _usable(parent, name, version)
            if why is None:
                found[name] = Controller(name, 2 if version == 2 else 1, parent)
                break
            problems.append(why)
    return Support(found.get("memory"), found.get("pids"),
                   tuple(p for p in problems if p.split(":")[0] not in found))


_lock = threading.Lock()
_support: dict[Path | None, Support] = {}


def support(explicit: Path | None = None) -> Support:
    """What binds a whole command on this host (probed once per process and setting); the
    cgroups that a dead worker's commands left behind are removed then."""
    with _lock:
        if explicit not in _support:
            _support[explicit] = found = _detect(explicit)
            for c in found.controllers():
                _sweep(c.parent)
        return _support[explicit]


def forget_support() -> None:
    """Probe (and sweep) again on next use."""
    with _lock:
        _support.clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(parent: Path) -> None:
    """Kill and remove the command cgroups in ``parent`` whose worker no longer runs (a worker
    killed mid-command cannot remove its own)."""
    with contextlib.suppress(OSError):
        for folder in parent.glob(f"{PREFIX}*-*"):
            owner = folder.name[len(PREFIX):].split("-", 1)[0]
            if not owner.isdigit() or _alive(int(owner)):
                continue
            with contextlib.suppress(OSError, ValueError):
                for pid in (folder / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
            # The killed processes take a moment to leave (rmdir is EBUSY until they have).
            _rmdir_when_empty(folder, time.monotonic() + REMOVE_WAIT_S)


def _rmdir_when_empty(folder: Path, until: float) -> None:
    """Remove a command cgroup once its killed processes have left, waiting until ``until``
    (monotonic) at most."""
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > until:
                log.warning("cannot remove the command cgroup %s: %s", folder, e)
                return
            time.sleep(0.01)


class CommandCgroup:
    """The cgroups of one command: made with its limits, joined by its first process, killed
    and removed when it ends. ``join`` runs in the forked child (a ``preexec_fn``)."""

    def __init__(self, support: Support, *, memory_bytes: int, processes: int):
        self.memory_bytes, self.processes = memory_bytes, processes
        self._dirs: list[tuple[Controller, Path]] = []
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            for c in support.controllers():
                folder = c.parent / name
                folder.mkdir()
                self._dirs.append((c, folder))
                self._limit(c, folder)
        except OSError:
            self.remove()
            raise
        self._procs = [str(folder / "cgroup.procs") for _, folder in self._dirs]

    def _limit(self, c: Controller, folder: Path) -> None:
        if c.name == "pids":
            (folder / "pids.max").write_text(str(self.processes))
        elif c.version == 2:
            (folder / "memory.max").write_text(str(self.memory_bytes))
            if (folder / "memory.swap.max").exists():
                (folder / "memory.swap.max").write_text("0")
        else:
            (folder / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to add
                (folder / "memory.memsw.limit_in_bytes").write_text(str(self.memory_bytes))

    def join(self) -> None:
        """Move the calling process into the command's cgroups (in the child, before exec)."""
        pid = str(os.getpid()).encode()
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def _members(self) -> set[int]:
        pids: set[int] = set()
        for _, folder in self._dirs:
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return pids

    def kill(self) -> None:
        """SIGKILL every process still in the command's cgroups (a process that left the
        command's process group included)."""
        for c, folder in self._dirs:
            if c.version == 2 and (folder / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (folder / "cgroup.kill").write_text("1")
        for _ in range(20):  # v1: kill what is there until nothing is left (pids bounds forks)
            members = self._members()
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def _counter(self, file: str, key: str) -> int:
        for _, folder in self._dirs:
            with contextlib.suppress(OSError, ValueError):
                for line in (folder / file).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        return 0

    def oom_kills(self) -> int:
        """Processes of the command the kernel killed at its memory limit."""
        return (self._counter("memory.events", "oom_kill")
                or self._counter("memory.oom_control", "oom_kill"))

    def forks_refused(self) -> int:
        """Forks of the command refused at its process limit."""
        return self._counter("pids.events", "max")

    def remove(self) -> None:
        """Remove the command's cgroups (waiting briefly for killed processes to leave)."""
        until = time.monotonic() + REMOVE_WAIT_S
        for _, folder in reversed(self._dirs):
            _rmdir_when_empty(folder, until)
        self._dirs = []
