"""run_command as the model calls it, inside a bound turn: the workspace as its directory, the
exit code, interleaved and capped output, a timeout that kills the whole process group within
a second or so, an environment without the worker's secrets, resource limits, and the sandbox:
bubblewrap where it works here (no network, the system read-only, nothing else of the host),
else the fallback. Its progress reaches the run's events while it runs.

Tests that start a command are ``fleet`` tests (tests/fleet_marks.py refuses unmarked spawns);
each runs in ~0.1-1.5 s. The bwrap cases skip where bwrap cannot run (install ``bubblewrap``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import queue, runs
from fermix_worker.providers import build_router
from fermix_worker.tools import OPERATOR, ToolRegistry, ToolResult
from fermix_worker.tools.command import OutputCap, command_tools, describe_exit
from fermix_worker.tools.context import bind_turn
from fermix_worker.tools.sandbox import bwrap_argv, clean_env, forget_probe, probe_bwrap
from fermix_worker.turn import TurnRunner
from tests.conftest import provider_env
from tests.fleet import uniq

CHAT = ConversationKey(channel="http", chat_id="cmd")


def settings_for(root: Path | None, sandbox: str = "auto", **extra: Any) -> Settings:
    return Settings(redis_url="redis://unused", workspace=root, sandbox=sandbox, **extra)


def run(settings: Settings, **args: Any) -> ToolResult:
    registry = ToolRegistry(command_tools(settings)).scoped(OPERATOR)
    with bind_turn(InboundMessage(key=CHAT, text="-")):
        return registry.execute(ToolCall(id="c", name="run_command", arguments=args))


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.content
    return result.content


def running(marker: str) -> list[int]:
    """Pids of processes whose command line contains ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws.resolve()


@pytest.fixture(params=["none", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each case in the fallback and, where it works here, in bubblewrap."""
    forget_probe()
    if request.param == "bwrap" and (problem := probe_bwrap().problem):
        pytest.skip(problem)
    yield request.param
    forget_probe()


# -- without starting a process --------------------------------------------------------------

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


def test_bwrap_mode_refuses_to_run_without_bwrap(monkeypatch: pytest.MonkeyPatch, root: Path,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    forget_probe()
    try:
        out = run(settings_for(root, sandbox="bwrap"), command="true")
    finally:
        forget_probe()
    assert out.is_error and "must run sandboxed here (FERMIX_SANDBOX=bwrap)" in out.content
    assert "bwrap is not installed" in out.content


@pytest.mark.fleet
def test_auto_falls_back_without_bwrap_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture,
                                                        root: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    forget_probe()
    try:
        for _ in range(2):
            assert ok(run(settings_for(root, "auto"), command="echo hi")).endswith("hi\n")
    finally:
        forget_probe()
    (warning,) = [r for r in caplog.records if r.name == "fermix_worker.tools.sandbox"]
    assert warning.levelname == "WARNING" and "not sandboxed: bwrap is not installed" in (
        warning.getMessage())

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
    if problem := probe_bwrap().problem:
        pytest.skip(problem)
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
    settings = Settings(redis_url="redis://unused", provider="openai", model="scripted-openai",
                        workspace=root, approvals={"policies": []})
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

