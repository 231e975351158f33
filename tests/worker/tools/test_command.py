"""run_command as the model calls it, with a turn's context: the workspace as its directory, the
exit code, interleaved and capped output, a timeout that kills the whole process group within
a second or so, an environment without the worker's secrets, resource limits (memory and
processes for the whole command, through its cgroup; bwrap's sized /tmp), and the sandbox:
bubblewrap where it works here (no network, the system read-only, nothing else of the host),
no run_command where it does not, and FERMIX_SANDBOX=none on the host without the worker's
secrets. Its progress reaches the run's events while it runs.

Tests that start a command are ``fleet`` tests (tests/fleet_marks.py refuses unmarked spawns);
each runs in ~0.1-1.5 s. The bwrap cases skip where bwrap cannot run (install ``bubblewrap``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.providers import build_router
from fermix_worker.tools import OPERATOR, ToolError, ToolRegistry, ToolResult, cgroups
from fermix_worker.tools.command import (
    OutputCap,
    command_tools,
    describe_exit,
    run_bounded,
    sandbox_report,
)
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.sandbox import (
    SUBAGENT_UNSANDBOXED,
    Bwrap,
    Limits,
    Unavailable,
    Unsandboxed,
    bwrap_argv,
    clean_env,
    forget_probe,
    plan,
    sandboxed,
)
from fermix_worker.turn import TurnRunner
from tests.conftest import provider_env
from tests.fleet import uniq

CHAT = ConversationKey(channel="http", chat_id="cmd")


def settings_for(root: Path | None, sandbox: str = "auto", **extra: Any) -> Settings:
    return Settings(redis_url="redis://unused", workspace=root, sandbox=sandbox, **extra)


def run(settings: Settings, **args: Any) -> ToolResult:
    registry = ToolRegistry(command_tools(settings)).scoped(OPERATOR)
    return registry.execute(ToolCall(id="c", name="run_command", arguments=args),
                            RunContext.for_turn(InboundMessage(key=CHAT, text="-")))


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.content
    return result.content


def processes(marker: str) -> dict[int, bytes]:
    """Pid -> command line (NUL-separated) of the processes whose command line holds
    ``marker``."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found[int(pid)] = cmdline
    return found


def running(marker: str) -> list[int]:
    """Pids of processes whose command line contains ``marker``."""
    return list(processes(marker))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws.resolve()


@pytest.fixture(params=["none", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each case in the fallback and, where it works here, in bubblewrap."""
    forget_probe()
    if request.param == "bwrap" and isinstance(found := plan("bwrap"), Unavailable):
        pytest.skip(found.reason)
    yield request.param
    forget_probe()


# -- without starting a process --------------------------------------------------------------

@pytest.mark.fleet  # offering the tool probes bwrap once
def test_no_workspace_no_command_tool() -> None:
    assert command_tools(settings_for(None)) == []
    (tool,) = command_tools(settings_for(Path("/srv/ws")))
    assert tool.policy == "exec" and not tool.idempotent


def test_the_environment_is_an_allow_list(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak")
    monkeypatch.setenv("FERMIX_API_TOKEN", "tok-leak")
    monkeypatch.setenv("TZ", "Europe/Paris")
    env = clean_env(root, root / "sub")
    assert env == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "HOME": str(root), "PWD": str(root / "sub"), "LANG": "C.UTF-8",
                   "TERM": "dumb", "NO_COLOR": "1", "SHELL": "/bin/sh", "TMPDIR": "/tmp",
                   "TZ": "Europe/Paris"}


def test_bwrap_binds_the_workspace_rw_the_system_ro_and_unshares_everything(root: Path) -> None:
    argv = bwrap_argv("/usr/bin/bwrap", root, root / "src", ["/bin/sh", "-c", "make"])
    flags = " ".join(argv)
    assert f"--bind {root} {root} --chdir {root}/src" in flags
    assert "--ro-bind /usr /usr" in flags and "--ro-bind /etc /etc" in flags
    assert "--unshare-all --die-with-parent" in flags and "--tmpfs /tmp" in flags
    assert argv[-4:] == ["--", "/bin/sh", "-c", "make"]
    assert "/home" not in flags and "/root" not in flags


def test_a_subagent_s_command_sees_the_workspace_read_only_and_never_runs_unsandboxed(
    root: Path
) -> None:
    argv = sandboxed(Bwrap("/usr/bin/bwrap"), root, root, ["make"], 1024, read_only=True)
    flags = " ".join(argv)
    assert f"--ro-bind {root} {root} --chdir {root}" in flags and f"--bind {root}" not in flags
    assert clean_env(root, root, home="/tmp")["HOME"] == "/tmp"
    with pytest.raises(ToolError) as e:
        sandboxed(Unsandboxed(unshare=None, setpriv=None), root, root, ["make"], 1024,
                  read_only=True)
    assert str(e.value) == SUBAGENT_UNSANDBOXED


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_without_bwrap_run_command_is_not_offered_and_refuses_calls(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, root: Path,
    tmp_path: Path, mode: str,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    forget_probe()
    try:
        registry = ToolRegistry(command_tools(settings_for(root, sandbox=mode))).scoped(OPERATOR)
        out = run(settings_for(root, sandbox=mode), command=f"touch {root}/ran")
    finally:
        forget_probe()
    assert registry.specs() == []
    assert out.is_error and out.content.startswith(
        "Error: run_command is not available on this worker: commands run only inside "
        "bubblewrap (FERMIX_SANDBOX=auto or bwrap), and bwrap is not installed")
    assert not (root / "ran").exists()
    assert any(r.levelname == "WARNING" and "run_command is not offered" in r.getMessage()
               for r in caplog.records)

@pytest.mark.fleet
@pytest.mark.parametrize(("args", "message"), [
    ({}, "exactly one of command"),
    ({"command": "ls", "argv": ["ls"]}, "exactly one of command"),
    ({"argv": []}, "non-empty list of strings"),
    ({"command": "ls", "timeout": -1}, "positive number of seconds"),
    ({"command": "ls", "cwd": "../.."}, "outside the workspace"),
])
def test_bad_arguments_are_refused_before_anything_runs(root: Path, args: dict[str, Any],
                                                        message: str) -> None:
    out = run(settings_for(root), **args)
    assert out.is_error and message in out.content


def test_output_over_the_cap_keeps_its_head_and_tail() -> None:
    cap = OutputCap(1000)
    for i in range(2000):
        cap.feed(f"line {i}\n".encode())
    text = cap.text()
    assert text.startswith("line 0\nline 1\n") and text.endswith("line 1999\n")
    assert "bytes of output omitted" in text and len(text) < 1100
    assert cap.latest(2) == "line 1998\nline 1999"


def test_exit_descriptions() -> None:
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-15) == "killed by SIGTERM"
    assert describe_exit(137) == "exit code 137 (128 + SIGKILL)"


# -- running commands ------------------------------------------------------------------------

@pytest.mark.fleet
def test_runs_in_the_workspace_with_exit_code_and_interleaved_output(root: Path,
                                                                     sandbox: str) -> None:
    (root / "sub").mkdir()
    s = settings_for(root, sandbox)
    out = ok(run(s, command="pwd; echo out; echo err >&2; echo $HOME; exit 3"))
    assert out.startswith("exit code 3, ")
    assert out.split("\n", 1)[1] == f"{root}\nout\nerr\n{root}\n"
    assert ok(run(s, argv=["pwd"], cwd="sub")).endswith(f"{root}/sub\n")
    assert ok(run(s, command="echo made > f.txt")).startswith("exit code 0")
    assert (root / "f.txt").read_text() == "made\n"


@pytest.mark.fleet
def test_a_timeout_kills_the_whole_group_within_a_second_or_two(root: Path, sandbox: str) -> None:
    marker = f"30.{os.getpid()}{len(sandbox)}1"
    started = time.monotonic()
    out = run(settings_for(root, sandbox), command=f"echo started; sleep {marker} & sleep {marker}",
              timeout=1)
    elapsed = time.monotonic() - started
    assert out.is_error and out.content.startswith("Error: command timed out after 1 s")
    assert "started" in out.content
    assert elapsed < 2.0, elapsed
    assert running(marker) == []


@pytest.mark.fleet
def test_the_timeout_argument_is_capped_by_the_setting(root: Path) -> None:
    started = time.monotonic()
    out = run(settings_for(root, "none", command_timeout_seconds=1), command="sleep 20",
              timeout=300)
    assert out.is_error and "timed out after 1 s" in out.content
    assert time.monotonic() - started < 2.0


@pytest.mark.fleet
def test_what_a_command_leaves_running_is_killed_when_it_ends(root: Path, sandbox: str) -> None:
    marker = f"31.{os.getpid()}{len(sandbox)}2"
    started = time.monotonic()
    ok(run(settings_for(root, sandbox), command=f"sleep {marker} & echo bye"))
    assert time.monotonic() - started < 1.5
    assert running(marker) == []


@pytest.mark.fleet
def test_a_command_that_closes_its_output_still_runs_to_its_end(root: Path) -> None:
    out = ok(run(settings_for(root, "none"), command="exec >&- 2>&-; sleep 0.5; touch done"))
    assert out.startswith("exit code 0") and (root / "done").exists()


@pytest.mark.fleet
def test_the_worker_s_secrets_do_not_reach_the_command(monkeypatch: pytest.MonkeyPatch,
                                                       root: Path, sandbox: str) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak-1")
    monkeypatch.setenv("FERMIX_API_TOKEN", "tok-leak-2")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-leak-3")
    out = ok(run(settings_for(root, sandbox), argv=["env"]))
    assert "leak" not in out and "FERMIX" not in out and "API_KEY" not in out
    assert f"HOME={root}" in out and "TERM=dumb" in out


@pytest.mark.fleet
def test_resource_limits_bind_the_command(root: Path, sandbox: str) -> None:
    s = settings_for(root, sandbox, command_memory_mb=512)
    out = ok(run(s, command="ulimit -t; ulimit -v; ulimit -n; ulimit -f", timeout=5))
    assert out.split("\n")[1:5] == ["6", str(512 * 1024), "1024", str(2 * 1024 * 1024)]
    big = ok(run(s, command="python3 -c 'x = bytearray(700 * 1024 * 1024)' 2>&1 | tail -1"))
    assert "MemoryError" in big


@pytest.mark.fleet
def test_long_output_keeps_its_head_and_tail(root: Path, sandbox: str) -> None:
    out = ok(run(settings_for(root, sandbox, command_output_chars=2000), command="seq 1 100000"))
    body = out.split("\n", 1)[1]
    assert body.startswith("1\n2\n3\n") and body.endswith("99999\n100000\n")
    assert "bytes of output omitted" in body and len(body) < 2200


@pytest.mark.fleet
def test_bwrap_has_no_network_a_read_only_system_and_none_of_the_host(root: Path,
                                                                      tmp_path: Path) -> None:
    forget_probe()
    if isinstance(found := plan("bwrap"), Unavailable):
        pytest.skip(found.reason)
    (tmp_path / "secret.txt").write_text("s3cret")
    s = settings_for(root, "bwrap")
    interfaces = ok(run(s, command="tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"))
    assert interfaces.split("\n")[1:] == ["lo", ""]
    assert "Read-only file system" in ok(run(s, command="touch /usr/fermix-escape"))
    assert not Path("/usr/fermix-escape").exists()
    assert "No such file" in ok(run(s, argv=["cat", str(tmp_path / "secret.txt")]))
    assert "No such file" in ok(run(s, argv=["ls", str(Path(__file__).parent)]))
    # A process that leaves the process group still dies with the sandbox's pid namespace.
    marker = f"32.{os.getpid()}3"
    ok(run(s, command=f"setsid sleep {marker} >/dev/null 2>&1 & echo ok"))
    time.sleep(0.2)
    assert running(marker) == []


@pytest.fixture
def sdk_env(llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in provider_env(llm, "openai").items():
        if not name.startswith("FERMIX_"):
            monkeypatch.setenv(name, value)


@pytest.mark.fleet
@pytest.mark.usefixtures("sdk_env")
def test_a_running_command_reports_its_output_as_tool_updates(
    r: redis.Redis, llm: ScriptedLLMServer, root: Path
) -> None:
    # The operator's verbose mode: tool events carry their progress text and result.
    settings = Settings(redis_url="redis://unused", provider="openai", model="scripted-openai",
                        workspace=root, approvals={"policies": []}, runs={"verbose": True})
    text = uniq("progress")
    script = "for i in 1 2 3 4 5; do echo step $i; sleep 0.25; done"
    llm.script.push(Reply(tool_calls=[ToolCallSpec("run_command", {"command": script})],
                          match=text),
                    Reply(text="done", match=text))
    runner = TurnRunner(r, settings, ToolRegistry(command_tools(settings)),
                        router=lambda: build_router(settings))
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id=uniq("chat")), text=text)
    queue.accept(r, msg)
    claim, lease = queue.claim(r, msg.key.as_str(), "w:1", 30)
    assert lease is not None
    runner.run(claim.messages, lease)
    rec = runs.get(r, msg.run_id)
    assert rec is not None and rec.reply == "done"
    events = [json.loads(fields["data"]) for _id, fields in r.xrange(keys.run_events(msg.run_id))
              if fields["stream"] == "tool"]
    phases = [e["phase"] for e in events]
    assert phases[0] == "start" and phases[-1] == "result", phases
    updates = [e["text"] for e in events if e["phase"] == "update"]
    assert len(updates) >= 2, updates
    assert updates[0].startswith("step 1") and all(u.startswith("step") for u in updates)
    assert "step 5" in events[-1]["result"] and "exit code 0" in events[-1]["result"]



# -- limits of the whole command (cgroups, bwrap's tmpfs) -----------------------------------

def needs_cgroup(name: str) -> None:
    if getattr(cgroups.support(), name) is None:
        pytest.skip(f"no writable {name} cgroup here: {cgroups.support().problems}")


@pytest.mark.fleet
def test_memory_binds_the_whole_command_not_each_process(root: Path, sandbox: str) -> None:
    needs_cgroup("memory")
    # Three processes of 150 MiB each under a 256 MiB cap: each fits the per-process limit,
    # all three together do not.
    hold = "import time; b = b'x' * (150 << 20); print('held', flush=True); time.sleep(1)"
    s = settings_for(root, sandbox, command_memory_mb=256)
    out = ok(run(s, command=f"for i in 1 2 3; do python3 -c \"{hold}\" & done; wait",
                 timeout=20))
    # Per-process limits would kill none. The kernel may kill a process that already printed
    # (the oldest, while a younger one allocates), so all three can say "held": what shows the
    # cap binds the whole command is that processes were killed for it.
    found = re.search(r"it reached its memory limit \(256 MiB for the whole command\) and (\d+) "
                      r"of its processes were killed", out.split("\n")[0])
    assert found is not None and int(found.group(1)) >= 1, out


@pytest.mark.fleet
def test_processes_bind_the_whole_command_even_as_root(root: Path, sandbox: str) -> None:
    needs_cgroup("pids")
    forks = ("import os, time\nn = 0\nfor _ in range(600):\n    try:\n        pid = os.fork()\n"
             "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n"
             "        os._exit(0)\n    n += 1\nprint('started', n)\n")
    (root / "forks.py").write_text(forks)
    started = time.monotonic()
    out = ok(run(settings_for(root, sandbox), argv=["python3", f"{root}/forks.py"], timeout=20))
    started_n = int(out.split("started ")[1].split()[0])
    assert started_n < 512, out
    assert "it reached its process limit (512 at once) and" in out.split("\n")[0]
    assert time.monotonic() - started < 10  # the forked sleepers died with the command
    assert running(f"{root}/forks.py") == []


@pytest.mark.fleet
def test_bwrap_s_tmp_is_bounded(root: Path) -> None:
    forget_probe()
    if isinstance(found := plan("bwrap"), Unavailable):
        pytest.skip(found.reason)
    s = settings_for(root, "bwrap", command_tmp_mb=8)
    out = ok(run(s, command="dd if=/dev/zero of=/tmp/fill bs=1M count=16 2>&1; df -k /tmp"))
    assert "No space left on device" in out, out
    assert " 8192 " in out  # the tmpfs is 8 MiB


@pytest.mark.fleet
def test_without_a_pid_namespace_the_worker_s_environ_is_still_unreadable(root: Path) -> None:
    forget_probe()
    found = plan("none")  # makes this process non-dumpable, as it does a worker
    forget_probe()
    assert isinstance(found, Unsandboxed)
    if found.setpriv is None:
        pytest.skip("a root worker with setpriv drops the command's capabilities")
    argv = sandboxed(Unsandboxed(unshare=None, setpriv=found.setpriv), root, root,
                     ["cat", f"/proc/{os.getpid()}/environ"], 0)
    done = run_bounded(argv, cwd=root, env=clean_env(root, root),
                       limits=Limits(cpu_seconds=5, memory_bytes=1 << 30), timeout_s=5,
                       output_chars=2000)
    assert done.output == f"cat: /proc/{os.getpid()}/environ: Permission denied\n"


@pytest.mark.fleet
def test_the_report_says_where_commands_run_and_what_bounds_them(root: Path) -> None:
    forget_probe()
    if isinstance(found := plan("auto"), Unavailable):
        pytest.skip(found.reason)
    report = sandbox_report(settings_for(root))
    assert (report.mode, report.state, report.run_command) == ("auto", "bwrap", True)
    assert report.detail.startswith("bubblewrap (") and "a sized /tmp" in report.detail
    support = cgroups.support()
    assert report.limits == support.describe()
    if support.memory and support.pids:
        assert "per process only" not in report.limits


@pytest.mark.fleet
def test_a_worker_killed_mid_command_leaves_nothing_running(root: Path, sandbox: str) -> None:
    marker = f"33.{os.getpid()}{len(sandbox)}4"
    script = textwrap.dedent(f"""
        from pathlib import Path
        from fermix_worker.tools import cgroups
        from fermix_worker.tools.command import run_bounded
        from fermix_worker.tools.sandbox import Limits, clean_env, plan, sandboxed
        root = Path({str(root)!r})
        marker = "{marker[:3]}" + "{marker[3:]}"  # not in this process's own command line
        argv = sandboxed(plan({sandbox!r}), root, root, ["sleep", marker], 1 << 20)
        support = cgroups.support()
        group = cgroups.CommandCgroup(support, memory_bytes=1 << 30, processes=64
                                      ) if support.controllers() else None
        print("ready", flush=True)
        run_bounded(argv, cwd=root, env=clean_env(root, root), output_chars=1000,
                    limits=Limits(cpu_seconds=60, memory_bytes=1 << 30), timeout_s=60,
                    cgroup=group)
    """)
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert worker.stdout is not None and worker.stdout.readline() == b"ready\n"
    # Mid-command: the command itself runs (not only bwrap, which is still setting up its
    # namespaces then: a worker killed in that window leaves a sandbox that bwrap 0.8 does not
    # tie to its parent yet; its cgroup is swept at the next worker start).
    wait_until(lambda: any(cmd.startswith(b"sleep\0") for cmd in processes(marker).values()), 10,
               "the command")
    worker.kill()
    worker.wait()
    # A bound on the event, not a speed: on main the command outlived its worker for its
    # whole 60 s (the sleep), here it dies at once (under a loaded suite, within seconds).
    wait_until(lambda: running(marker) == [], 10, "the command to die with its worker")
    cgroups.forget_support()  # the next probe sweeps what the dead worker left
    leftovers = [c.parent.glob(f"{cgroups.PREFIX}{worker.pid}-*")
                 for c in cgroups.support().controllers()]
    assert [list(found) for found in leftovers] == [[] for _ in leftovers]


@pytest.mark.fleet
def test_unsandboxed_a_process_that_leaves_the_group_still_dies_with_the_command(
    root: Path,
) -> None:
    marker = f"34.{os.getpid()}5"
    ok(run(settings_for(root, "none"), command=f"setsid sleep {marker} >/dev/null 2>&1 & echo ok"))
    wait_until(lambda: running(marker) == [], 1, "the escaped process to be killed")
