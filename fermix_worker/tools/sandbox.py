"""Where ``run_command`` runs: bubblewrap when the host has it, else a documented fallback.

Always: the command gets its own process group (a timeout kills all of it), an environment of
a few variables only (``PATH``, ``HOME`` = the workspace, ``LANG``, ``TERM=dumb``, ...: never a
provider key, a token or a ``FERMIX_*`` variable of the worker), and resource limits set in the
child (:class:`Limits`: CPU seconds, address space, file size, open files, processes).

bubblewrap (``bwrap`` on PATH; Debian package ``bubblewrap``): the command sees the system
read-only (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``; the file ``FERMIX_CONFIG`` names
is masked), the workspace read-write at its own path, a private ``/tmp``, its own ``/proc`` and
a minimal ``/dev``, and nothing else of the host: no home directory, no worker code, no other
workspace. ``--unshare-all``: no network but its own loopback, its own pid, ipc, uts and cgroup
namespaces; ``--die-with-parent``; no capabilities, even when the worker runs as root.

Fallback (``FERMIX_SANDBOX=none``, or ``auto`` where bwrap is missing or cannot create
namespaces, as in most unprivileged containers): the command runs directly, with the limits,
the clean environment and its own process group only. It can read what the worker's user can
read and reach the network, and a process that starts its own session outlives the group kill.
``auto`` logs that once per process; ``FERMIX_SANDBOX=bwrap`` refuses to run commands instead.
Whether bwrap works is probed once per process, with the flags a command would get.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fermix_worker.tools.base import ToolError

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bwrap", "none"]

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The host's system, read-only inside bwrap (a symlink, as /bin on merged-/usr systems, is
# recreated as the same symlink).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Limits:
    """Resource limits of one command, set in the child before it execs (never above the
    worker's own hard limits). ``processes`` counts every process of the worker's user on the
    host and does not bind root."""

    cpu_seconds: int
    memory_bytes: int
    file_bytes: int = 1024**3
    open_files: int = 1024
    processes: int = 512

    def apply(self) -> None:
        """Lower this process's limits (a ``preexec_fn``: runs in the forked child)."""
        for which, value in (
            (resource.RLIMIT_CPU, self.cpu_seconds),
            (resource.RLIMIT_AS, self.memory_bytes),
            (resource.RLIMIT_FSIZE, self.file_bytes),
            (resource.RLIMIT_NOFILE, self.open_files),
            (resource.RLIMIT_NPROC, self.processes),
        ):
            _, hard = resource.getrlimit(which)
            # CPU: SIGXCPU at the soft limit, SIGKILL a little later at the hard one.
            top = value + 2 if which == resource.RLIMIT_CPU else value
            if hard != resource.RLIM_INFINITY:
                value, top = min(value, hard), min(top, hard)
            resource.setrlimit(which, (value, top))


def clean_env(root: Path, cwd: Path) -> dict[str, str]:
    """The whole environment of a command: nothing is inherited but ``TZ``."""
    env = {
        "PATH": SAFE_PATH, "HOME": str(root), "PWD": str(cwd), "LANG": "C.UTF-8",
        "TERM": "dumb", "NO_COLOR": "1", "SHELL": "/bin/sh", "TMPDIR": "/tmp",
    }
    if tz := os.environ.get("TZ"):
        env["TZ"] = tz
    return env


def bwrap_argv(bwrap: str, root: Path, cwd: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` inside bubblewrap: the system read-only, ``root`` read-write, no network."""
    out = [bwrap]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            out += ["--ro-bind", d, d]
    config = os.environ.get("FERMIX_CONFIG")
    if config and os.path.isfile(config):  # the worker's config may hold tokens
        out += ["--ro-bind", "/dev/null", os.path.realpath(config)]
    out += [
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--bind", str(root), str(root), "--chdir", str(cwd),
        "--unshare-all", "--die-with-parent",
        "--", *argv,
    ]
    return out


@dataclass(frozen=True)
class _Probe:
    bwrap: str | None
    problem: str | None


_probe_lock = threading.Lock()
_probe: _Probe | None = None
_warned = False


def probe_bwrap() -> _Probe:
    """Whether bwrap can sandbox a command on this host (cached for the process)."""
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = _run_probe()
        return _probe


def forget_probe() -> None:
    """Probe again on next use (tests change PATH)."""
    global _probe, _warned
    with _probe_lock:
        _probe, _warned = None, False


def _run_probe() -> _Probe:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _Probe(None, "bwrap is not installed (Debian/Ubuntu package: bubblewrap)")
    with tempfile.TemporaryDirectory(prefix="fermix-bwrap-probe-") as tmp:
        root = Path(tmp).resolve()
        try:
            done = subprocess.run(bwrap_argv(bwrap, root, root, ["true"]), env=clean_env(root, root),
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=PROBE_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return _Probe(None, f"bwrap cannot run: {e}")
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        return _Probe(None, f"bwrap cannot create its namespaces here: {why}")
    return _Probe(bwrap, None)


def sandboxed(mode: SandboxMode, root: Path, cwd: Path, argv: Sequence[str]) -> list[str]:
    """What to start for ``argv`` under ``mode``: ``argv`` inside bwrap, or ``argv`` itself
    (the fallback). ``bwrap`` mode without a working bwrap is a :class:`ToolError`."""
    global _warned
    if mode == "none":
        return list(argv)
    probe = probe_bwrap()
    if probe.bwrap is not None:
        return bwrap_argv(probe.bwrap, root, cwd, argv)
    if mode == "bwrap":
        raise ToolError(f"commands must run sandboxed here (FERMIX_SANDBOX=bwrap), but "
                        f"{probe.problem}")
    if not _warned:
        _warned = True
        log.warning("run_command is not sandboxed: %s. Commands run with resource limits, a "
                    "clean environment and their own process group only (FERMIX_SANDBOX)",
                    probe.problem)
    return list(argv)
