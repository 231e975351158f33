"""Where ``run_command`` runs: inside bubblewrap, or (only when asked) on the host; fails closed.

``FERMIX_SANDBOX`` (:func:`plan`, probed once per process with the flags a command gets):

- ``auto`` (default) and ``bwrap``: bubblewrap or no ``run_command``. Where bwrap is missing or
  cannot create its namespaces (most unprivileged containers), the tool is not offered to the
  model, a call made anyway is refused with the reason, and the worker says why at start
  (WARNING), in ``fermix doctor`` and in ``/v1/status``. A command never runs on the host
  because a sandbox was unavailable.
- ``none``: every command runs on the host, unsandboxed, by the operator's explicit choice.

Always: the command gets its own process group and a cgroup (:mod:`.cgroups`; a timeout kills
all of it), an environment of a few variables only (:func:`clean_env`: never a provider key, a
token or a ``FERMIX_*`` variable of the worker), and resource limits (:class:`Limits`).

bubblewrap (``bwrap``; Debian package ``bubblewrap``): the command sees the system read-only
(``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``; the file ``FERMIX_CONFIG`` names is
masked), the workspace read-write at its own path, a private ``/tmp`` of ``command_tmp_mb``
(a tmpfs; writing past it fails with ENOSPC), its own ``/proc`` and a minimal ``/dev``, and
nothing else of the host. ``--unshare-all``: no network but its own loopback, its own pid,
ipc, uts and cgroup namespaces; ``--die-with-parent``; no capabilities, even as root.

A subagent's command (:func:`sandboxed` with ``read_only``) gets its own bubblewrap like any
other, with the workspace mounted read-only and ``HOME`` in its private ``/tmp``: it can read
its parent turn's files but write none. Unsandboxed (``none``) nothing can make the workspace
read-only, so subagents' commands are refused there.

``none``, what still holds (:class:`Unsandboxed`): the worker makes itself non-dumpable
(``PR_SET_DUMPABLE`` 0: its ``/proc/<pid>/environ``, ``mem`` and ``fd`` need
``CAP_SYS_PTRACE``); under a root worker the command runs without any capability (setpriv:
bounding, inheritable and ambient sets emptied, ``no_new_privs``), so it cannot read them;
where ``unshare --pid --fork --mount-proc`` works (root, or user namespaces) it also gets its
own pid namespace and ``/proc``, where the worker does not exist. It still reads what the
worker's user can read, writes where that user can write and reaches the network (Redis too).
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, assert_never

from fermix_worker.tools.base import ToolError

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bwrap", "none"]

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The host's system, read-only inside bwrap (a symlink, as /bin on merged-/usr systems, is
# recreated as the same symlink).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
PROBE_TIMEOUT_S = 10.0
PROBE_TMP_BYTES = 1024 * 1024
UNSHARE = ("--pid", "--fork", "--mount-proc", "--kill-child", "--")
NO_CAPS = ("--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs",
           "--")
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits of one command, set in the child before it execs (never
    above the worker's own hard limits). The whole command's memory and processes are bound
    by its cgroup (:mod:`.cgroups`) where the host has one; ``RLIMIT_NPROC`` alone counts every
    process of the worker's user and does not bind root."""

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


def clean_env(root: Path, cwd: Path, home: str | None = None) -> dict[str, str]:
    """The whole environment of a command: nothing is inherited but ``TZ``. ``HOME`` is the
    workspace root, or ``home`` (a subagent's command, whose workspace is read-only: /tmp)."""
    env = {
        "PATH": SAFE_PATH, "HOME": home or str(root), "PWD": str(cwd), "LANG": "C.UTF-8",
        "TERM": "dumb", "NO_COLOR": "1", "SHELL": "/bin/sh", "TMPDIR": "/tmp",
    }
    if tz := os.environ.get("TZ"):
        env["TZ"] = tz
    return env


def bwrap_argv(bwrap: str, root: Path, cwd: Path, argv: Sequence[str],
               tmp_bytes: int | None = None, *, read_only: bool = False) -> list[str]:
    """``argv`` inside bubblewrap: the system read-only, ``root`` read-write (``read_only``:
    read-only, a subagent's command), no network, a ``/tmp`` of ``tmp_bytes`` (None:
    unsized)."""
    out = [bwrap]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            out += ["--ro-bind", d, d]
    config = os.environ.get("FERMIX_CONFIG")
    if config and os.path.isfile(config):  # the worker's config may hold tokens
        out += ["--ro-bind", "/dev/null", os.path.realpath(config)]
    out += ["--proc", "/proc", "--dev", "/dev"]
    if tmp_bytes is not None:
        out += ["--size", str(tmp_bytes)]
    out += [
        "--tmpfs", "/tmp", "--ro-bind" if read_only else "--bind", str(root), str(root),
        "--chdir", str(cwd),
        "--unshare-all", "--die-with-parent",
        "--", *argv,
    ]
    return out


@dataclass(frozen=True)
class Bwrap:
    """Commands run inside bubblewrap; ``sized_tmp``: this bwrap can size its tmpfs."""

    path: str
    sized_tmp: bool = True


@dataclass(frozen=True)
class Unsandboxed:
    """``FERMIX_SANDBOX=none``: on the host, with what still holds (see the module doc)."""

    unshare: str | None  # its own pid namespace and /proc, through this unshare
    setpriv: str | None  # no capabilities (a root worker), through this setpriv


@dataclass(frozen=True)
class Unavailable:
    """No ``run_command`` here: the mode needs bwrap and bwrap cannot run."""

    reason: str


Plan = Bwrap | Unsandboxed | Unavailable

_probe_lock = threading.Lock()
_plans: dict[SandboxMode, Plan] = {}


def plan(mode: SandboxMode) -> Plan:
    """How commands run under ``mode`` on this host (probed once per process and mode)."""
    with _probe_lock:
        if mode not in _plans:
            _plans[mode] = _unsandboxed() if mode == "none" else _probe_bwrap()
        return _plans[mode]


def forget_probe() -> None:
    """Probe again on next use (tests change PATH)."""
    with _probe_lock:
        _plans.clear()


def _run(argv: Sequence[str], root: Path) -> subprocess.CompletedProcess[bytes] | str:
    try:
        return subprocess.run(argv, env=clean_env(root, root), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{argv[0]} cannot run: {e}"


def _why(done: subprocess.CompletedProcess[bytes]) -> str:
    return done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"


def _probe_bwrap() -> Plan:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Unavailable("bwrap is not installed (Debian/Ubuntu package: bubblewrap)")
    with tempfile.TemporaryDirectory(prefix="fermix-bwrap-probe-") as tmp:
        root = Path(tmp).resolve()
        done = _run(bwrap_argv(bwrap, root, root, ["true"], PROBE_TMP_BYTES), root)
        if not isinstance(done, str) and done.returncode != 0 and b"--size" in done.stderr:
            # bwrap before 0.5 has no --size: sandboxed still, /tmp bounded by memory only.
            unsized = _run(bwrap_argv(bwrap, root, root, ["true"]), root)
            if not isinstance(unsized, str) and unsized.returncode == 0:
                return Bwrap(bwrap, sized_tmp=False)
    if isinstance(done, str):
        return Unavailable(done)
    if done.returncode != 0:
        return Unavailable(f"bwrap cannot create its namespaces here: {_why(done)}")
    return Bwrap(bwrap)


def _unsandboxed() -> Plan:
    _make_worker_undumpable()
    with tempfile.TemporaryDirectory(prefix="fermix-host-probe-") as tmp:
        root = Path(tmp).resolve()
        unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
        if unshare is not None and not _succeeds(_run([unshare, *UNSHARE, "true"], root)):
            unshare = None
        if setpriv is not None and (os.geteuid() != 0
                                    or not _succeeds(_run([setpriv, *NO_CAPS, "true"], root))):
            setpriv = None
    return Unsandboxed(unshare=unshare, setpriv=setpriv)


def _succeeds(done: subprocess.CompletedProcess[bytes] | str) -> bool:
    return not isinstance(done, str) and done.returncode == 0


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (a ``preexec_fn``: a worker killed mid-command
    leaves nothing running; bwrap does the same for what it starts). ``parent``: the pid of the
    parent, in case it died before this ran."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _make_worker_undumpable() -> None:
    """Make this process's /proc files (environ, mem, fd) unreadable without CAP_SYS_PTRACE."""
    try:
        if _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as e:
        log.warning("cannot make the worker non-dumpable (%s): an unsandboxed command of the "
                    "same user may read its /proc/<pid>/environ", e)


def describe(p: Plan) -> str:
    """One sentence: where commands run and what isolates them."""
    match p:
        case Bwrap(path=path, sized_tmp=sized):
            tmp = "a sized /tmp" if sized else "an unsized /tmp (bwrap < 0.5 has no --size)"
            return f"bubblewrap ({path}): no network, the system read-only, {tmp}"
        case Unsandboxed(unshare=unshare, setpriv=setpriv):
            held = ["a clean environment", "the worker non-dumpable"]
            if setpriv:
                held.append("no capabilities")
            held.append("its own pid namespace and /proc" if unshare else
                        "the host's pid namespace (unshare --pid is not available)")
            return ("unsandboxed by FERMIX_SANDBOX=none: the host's files (as the worker's "
                    f"user) and network; {', '.join(held)}")
        case Unavailable(reason=reason):
            return f"run_command is not offered: {reason}"
        case _:
            assert_never(p)


def sandboxed(p: Plan, root: Path, cwd: Path, argv: Sequence[str], tmp_bytes: int, *,
              read_only: bool = False) -> list[str]:
    """What to start for ``argv`` under ``p``; :class:`Unavailable` is a :class:`ToolError`.
    ``read_only`` (a subagent's command): the workspace is mounted read-only, which only
    bubblewrap can do, so unsandboxed it is a :class:`ToolError` too."""
    match p:
        case Bwrap(path=path, sized_tmp=sized):
            return bwrap_argv(path, root, cwd, argv, tmp_bytes if sized else None,
                              read_only=read_only)
        case Unsandboxed(unshare=unshare, setpriv=setpriv):
            if read_only:
                raise ToolError(SUBAGENT_UNSANDBOXED)
            out = list(argv)
            if setpriv:
                out = [setpriv, *NO_CAPS, *out]
            return [unshare, *UNSHARE, *out] if unshare else out
        case Unavailable(reason=reason):
            raise ToolError(unavailable_message(reason))
        case _:
            assert_never(p)


SUBAGENT_UNSANDBOXED = (
    "run_command cannot run in a subagent on this worker: a subagent's commands run only inside "
    "bubblewrap, which shows them the workspace read-only, and this worker runs commands "
    "unsandboxed (FERMIX_SANDBOX=none). Nothing was run; leave this step to the main "
    "conversation")


def unavailable_message(reason: str) -> str:
    """What the model (and the operator) read when run_command cannot run here."""
    return (f"run_command is not available on this worker: commands run only inside "
            f"bubblewrap (FERMIX_SANDBOX=auto or bwrap), and {reason}. Nothing was run; an "
            "operator can make bwrap work here, or set FERMIX_SANDBOX=none to run commands "
            "unsandboxed")
