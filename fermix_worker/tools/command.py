"""``run_command``: a shell command (or an argv) in the turn's workspace, bounded and sandboxed.

The command runs with the workspace (or a folder in it) as its working directory, in the sandbox
:mod:`fermix_worker.tools.sandbox` chooses (where that is unavailable the tool is not offered),
in a cgroup of its own that bounds its memory and processes (:mod:`fermix_worker.tools.cgroups`)
under a timeout (its ``timeout`` argument, capped by
``command_timeout_seconds``). On timeout its whole process group is killed and the model gets
"timed out after N s" with the output so far; when it ends, whatever it left running in its
group is killed too. stdout and stderr come back interleaved, as printed, cut to their head and
tail past ``command_output_chars``. While it runs, its latest lines are reported as ``tool``
update events (the call's context's reporter: :mod:`fermix_worker.tools.progress`). In a
subagent the command gets a bubblewrap of its own, under the same cgroup limits and timeout,
with its parent turn's workspace mounted read-only (:func:`~.sandbox.sandboxed`).

Policy class ``exec``; not idempotent (a durable turn does not re-run it after a crash). Under
gevent ``subprocess`` and ``select`` are cooperative: a running command holds only its turn.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never

from fermix_shared.settings import Settings
from fermix_shared.stores.sandbox import SandboxReport, SandboxState
from fermix_worker.tools import cgroups, sandbox
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.cgroups import CommandCgroup
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.sandbox import Limits, clean_env, die_with_parent, sandboxed
from fermix_worker.tools.workspace import run_workspace, workspace_configured

log = logging.getLogger(__name__)

NAME = "run_command"
READ_CHUNK = 65536
# How long output is still read after the command itself exited (a straggler may hold the pipe).
EXIT_GRACE_S = 0.25
POLL_S = 0.25
PROGRESS_LINES = 5
# The registry's own bound on the tool sits this far past the command's, so the command's
# timeout, with its clear message and its output, always comes first.
REGISTRY_MARGIN_S = 15.0


class OutputCap:
    """What a command prints, kept to its first and last ``limit // 2`` bytes."""

    def __init__(self, limit: int):
        self._half = limit // 2
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        if len(self._tail) > self._half:
            del self._tail[:len(self._tail) - self._half]

    def latest(self, lines: int = PROGRESS_LINES) -> str:
        """The last few lines printed so far (a progress update)."""
        omitted = self.total - len(self._head) - len(self._tail)
        recent = self._tail if omitted else self._head + self._tail
        text = bytes(recent[-2048:]).decode(errors="replace")
        return "\n".join(text.rstrip("\n").split("\n")[-lines:])

    def text(self) -> str:
        omitted = self.total - len(self._head) - len(self._tail)
        head = self._head.decode(errors="replace")
        if omitted == 0:
            return head + self._tail.decode(errors="replace")
        return (f"{head}\n[... {omitted:,} bytes of output omitted ...]\n"
                f"{self._tail.decode(errors='replace')}")


@dataclass(frozen=True)
class Finished:
    returncode: int
    timed_out: bool
    output: str
    seconds: float
    oom_kills: int = 0  # processes the kernel killed at the command's memory limit
    forks_refused: int = 0  # forks refused at the command's process limit


def run_bounded(argv: Sequence[str], *, cwd: Path, env: dict[str, str], limits: Limits,
                timeout_s: float, output_chars: int,
                cgroup: CommandCgroup | None = None,
                report: Callable[[str], None] = lambda text: None) -> Finished:
    """Run ``argv`` in its own process group (and ``cgroup``, which it joins before it execs)
    until it ends or ``timeout_s`` passes, reading its output as it comes (its latest lines
    go to ``report``); the group and the cgroup are killed either way (and if this call is
    interrupted)."""
    started = time.monotonic()
    worker = os.getpid()

    def prepare() -> None:  # in the child, between fork and exec
        if cgroup is not None:
            cgroup.join()
        die_with_parent(worker)
        limits.apply()

    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=prepare,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolError(f"cannot start {argv[0]!r}: {getattr(e, 'strerror', None) or e}") from e
    out = OutputCap(output_chars)
    assert proc.stdout is not None
    try:
        timed_out = _pump(proc, proc.stdout.fileno(), out, started + timeout_s, report)
    finally:
        _kill_group(proc.pid, proc)
        if cgroup is not None:
            cgroup.kill()
        proc.stdout.close()
    return Finished(proc.returncode, timed_out, out.text(), time.monotonic() - started,
                    cgroup.oom_kills() if cgroup else 0, cgroup.forks_refused() if cgroup else 0)


def _pump(proc: subprocess.Popen[bytes], fd: int, out: OutputCap, deadline: float,
          report: Callable[[str], None]) -> bool:
    """Read output until the command exited and every writer closed the pipe (or a moment
    after it exited, when something it left running holds the pipe); True: the deadline
    passed first."""
    poller = select.poll()  # patched by gevent: waits cooperatively, no FD_SETSIZE limit
    poller.register(fd, select.POLLIN)
    exited, stop_at = False, deadline
    while True:
        now = time.monotonic()
        if now >= stop_at:
            return not exited
        if not exited and proc.poll() is not None:
            exited, stop_at = True, min(deadline, now + EXIT_GRACE_S)
        if not poller.poll(min(stop_at - now, POLL_S) * 1000):
            continue
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:  # gevent leaves the pipe non-blocking
            continue
        if not chunk:  # every writer closed the pipe; the command may still be running
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return True
            return False
        out.feed(chunk)
        report(out.latest())


# After SIGKILL, how long to wait for the group's processes to be gone (a loaded machine may
# take a moment to run their exit; an unreaped zombie stays "in" the group until then).
KILL_WAIT_S = 0.5


def _kill_group(pgid: int, leader: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left in the command's process group, reap its leader (our child),
    and wait briefly until the rest is gone, so nothing of the command still runs when the
    tool returns (nothing left: no-op). An orphan's zombie that the host's init does not reap
    keeps the group id taken: the wait is bounded by KILL_WAIT_S."""
    # The group id stays taken while any member lives, so it cannot name another group here.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    leader.wait()
    until = time.monotonic() + KILL_WAIT_S
    while _group_running(pgid) and time.monotonic() < until:
        time.sleep(0.005)


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, dead but not yet reaped by
    the host's init, do not count). Reads /proc; without it, assumes none."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _argv(args: dict[str, Any]) -> list[str]:
    """The argv to run: ``command`` through ``/bin/sh -c``, or ``argv`` as given."""
    command, argv = args.get("command"), args.get("argv")
    if (command is None) == (argv is None):
        raise ToolError("give exactly one of command (a shell command line) and argv (a list)")
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        return ["/bin/sh", "-c", command]
    if (not isinstance(argv, list) or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise ToolError("argv must be a non-empty list of strings")
    return list(argv)


def _timeout(args: dict[str, Any], cap: float) -> float:
    value = args.get("timeout")
    if value is None:
        return cap
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ToolError("timeout must be a positive number of seconds")
    return min(float(value), cap)


def describe_exit(returncode: int) -> str:
    """``exit code 0``, ``killed by SIGTERM``, ``exit code 137 (128 + SIGKILL)``."""
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)}"
    if 128 < returncode <= 128 + 64:
        return f"exit code {returncode} (128 + {_signal_name(returncode - 128)})"
    return f"exit code {returncode}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_command(ctx: RunContext, settings: Settings, args: dict[str, Any]) -> str:
    """The tool's body: run one command in the calling turn's workspace (a subagent's: its
    parent turn's, read-only), reporting its progress to ``ctx``."""
    ws = run_workspace(settings, ctx)
    argv = _argv(args)
    cwd = ws.resolve(args["cwd"]) if args.get("cwd") else ws.root
    if not cwd.is_dir():
        raise ToolError(f"cwd {ws.rel(cwd)} is not a directory")
    timeout = _timeout(args, settings.command_timeout_seconds)
    memory = settings.command_memory_mb * 1024 * 1024
    full = sandboxed(sandbox.plan(settings.sandbox), ws.root, cwd, argv,
                     settings.command_tmp_mb * 1024 * 1024, read_only=ws.read_only)
    limits = Limits(cpu_seconds=math.ceil(timeout) + 1, memory_bytes=memory,
                    processes=settings.command_processes)
    bound = cgroups.support(settings.command_cgroup)
    try:
        group = CommandCgroup(bound, memory_bytes=memory, processes=settings.command_processes
                              ) if bound.controllers() else None
    except OSError as e:
        raise ToolError(f"the command's cgroup cannot be created: {e.strerror or e}; nothing "
                        "was run") from e
    try:
        env = clean_env(ws.root, cwd, home="/tmp" if ws.read_only else None)
        done = run_bounded(full, cwd=cwd, env=env, limits=limits,
                           timeout_s=timeout, output_chars=settings.command_output_chars,
                           cgroup=group, report=ctx.report)
    finally:
        if group is not None:
            group.remove()
    output = done.output or "(no output)"
    notes = _limit_notes(done, settings)
    if done.timed_out:
        raise ToolError(f"command timed out after {timeout:g} s and was killed{notes}; output "
                        f"so far:\n{output}")
    return f"{describe_exit(done.returncode)}, {done.seconds:.1f} s{notes}\n{output}"


def _limit_notes(done: Finished, settings: Settings) -> str:
    """What the command's cgroup refused it, as the model should read it."""
    notes = ""
    if done.oom_kills:
        notes += (f"; it reached its memory limit ({settings.command_memory_mb} MiB for the "
                  f"whole command) and {done.oom_kills} of its processes were killed")
    if done.forks_refused:
        forks = "1 fork was" if done.forks_refused == 1 else f"{done.forks_refused} forks were"
        notes += (f"; it reached its process limit ({settings.command_processes} at once) and "
                  f"{forks} refused")
    return notes


def sandbox_report(settings: Settings) -> SandboxReport:
    """How this worker runs commands (probed once per process): for doctor and /v1/status."""
    p = sandbox.plan(settings.sandbox)
    state: SandboxState = ("bwrap" if isinstance(p, sandbox.Bwrap) else
                           "none" if isinstance(p, sandbox.Unsandboxed) else "unavailable")
    return SandboxReport(
        mode=settings.sandbox, state=state, detail=sandbox.describe(p),
        limits=cgroups.support(settings.command_cgroup).describe(),
        run_command=workspace_configured(settings) and state != "unavailable")


def _warn_at_start(settings: Settings, p: sandbox.Plan) -> None:
    match p:
        case sandbox.Unavailable(reason=reason):
            log.warning("run_command is not offered on this worker: %s",
                        sandbox.unavailable_message(reason))
        case sandbox.Unsandboxed():
            log.warning("run_command is not sandboxed (FERMIX_SANDBOX=none): %s",
                        sandbox.describe(p))
        case sandbox.Bwrap():
            pass
        case _:
            assert_never(p)
    bound = cgroups.support(settings.command_cgroup)
    if not isinstance(p, sandbox.Unavailable) and (bound.memory is None or bound.pids is None):
        log.warning("run_command's limits: %s (%s); a command of several processes can use "
                    "more than command_memory_mb / command_processes in all",
                    bound.describe(), "; ".join(bound.problems))


def command_tools(settings: Settings, *, warn: bool = True) -> list[Tool]:
    """``run_command`` when a workspace is configured, else nothing. Where its sandbox is
    unavailable the tool is there but offered to no one, and says why when called. ``warn``:
    log what limits it at start (once per process: the turns' copy does)."""
    if not workspace_configured(settings):
        return []
    p = sandbox.plan(settings.sandbox)
    if warn:
        _warn_at_start(settings, p)
    cap = settings.command_timeout_seconds
    return [Tool(
        name=NAME,
        description=(
            "Run a shell command (`command`, via /bin/sh -c) or a program with its arguments "
            f"(`argv`) in the workspace. Ends after `timeout` seconds (at most {cap:g}); returns "
            "the exit code and stdout+stderr (long output keeps its head and tail). Where "
            "sandboxed, only the workspace is writable and there is no network."),
        parameters={"type": "object", "properties": {
            "command": {"type": "string", "description": "a shell command line"},
            "argv": {"type": "array", "items": {"type": "string"},
                     "description": "a program and its arguments, instead of command"},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": cap},
            "cwd": {"type": "string", "description": "a folder in the workspace (default: "
                                                     "its root)"},
        }},
        run=lambda ctx, args: run_command(ctx, settings, args),
        policy="exec",
        idempotent=False,
        timeout_s=cap + REGISTRY_MARGIN_S,
        unavailable=(sandbox.unavailable_message(p.reason)
                     if isinstance(p, sandbox.Unavailable) else None),
    )]
