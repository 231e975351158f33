"""The command sandbox fails closed, through a real gateway and ``celery worker``.

A worker whose ``bwrap`` cannot create its namespaces (a PATH shim that fails exactly as bwrap
does in an unprivileged container) under ``FERMIX_SANDBOX=auto`` offers the model no
``run_command``; a call made anyway is refused with the reason and runs nothing; the worker
says so in ``/v1/status`` and ``fermix doctor``. Under an explicit ``FERMIX_SANDBOX=none`` the
command runs on the host, yet sees none of the worker's secrets: not in its environment, not
in ``/proc/<worker pid>/environ``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, turn_calls, uniq, wait

pytestmark = pytest.mark.fleet

SECRET = "s3cret-of-the-worker-7f1c"
# What bubblewrap prints in a container that forbids unprivileged user namespaces.
BWRAP_REFUSAL = ("bwrap: No permissions to creating new namespace, likely because the kernel "
                 "does not allow non-privileged user namespaces. On e.g. debian this can be "
                 "enabled with 'sysctl kernel.unprivileged_userns_clone=1'.")


def broken_bwrap(folder: Path) -> Path:
    """A ``bwrap`` that fails as bubblewrap does where it cannot create namespaces."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "bwrap"
    shim.write_text(f"#!/bin/sh\necho \"{BWRAP_REFUSAL}\" >&2\nexit 1\n")
    shim.chmod(0o755)
    return folder


def stack_env(llm: ScriptedLLMServer, workspace: Path, **extra: str) -> dict[str, str]:
    workspace.mkdir(parents=True, exist_ok=True)
    return {**provider_env(llm, "openai"), "FERMIX_WORKSPACE": str(workspace),
            "FERMIX_TEST_SECRET": SECRET, "FERMIX_APPROVALS__POLICIES": "[]",
            **extra}


def turn(stack: Stack, llm: ScriptedLLMServer, command: str) -> tuple[list[str], str, dict[str, Any]]:
    """One turn whose model calls run_command with ``command``: the tools it was offered, the
    tool result it read, and the finished run."""
    text = uniq("sandbox")
    llm.script.push(Reply(tool_calls=[ToolCallSpec("run_command", {"command": command})],
                          match=text),
                    Reply(text="done", match=text))
    with stack.http() as http:
        out = wait(http, start(http, text, uniq("chat")), timeout=60)
    assert out["status"] == "ok", out
    first, second = [r["body"] for r in turn_calls(llm.script.requests)
                     if text in json.dumps(r["body"])]
    offered = sorted(t["function"]["name"] for t in first.get("tools") or [])
    (result,) = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    return offered, result, out


@pytest.fixture(scope="module")
def closed(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    tmp = tmp_path_factory.mktemp("sandbox-closed")
    shims = broken_bwrap(tmp / "bin")
    env = stack_env(llm, tmp / "ws", PATH=f"{shims}:{Path(sys.executable).parent}:/usr/bin:/bin")
    s = start_stack("sandbox-closed", redis_url, 3, env, logs_dir, workers=1)
    yield s, tmp / "ws"
    s.stop()


@pytest.fixture(scope="module")
def unsandboxed(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    tmp = tmp_path_factory.mktemp("sandbox-none")
    s = start_stack("sandbox-none", redis_url, 4, stack_env(llm, tmp / "ws", FERMIX_SANDBOX="none"),
                    logs_dir, workers=1)
    yield s, tmp / "ws"
    s.stop()


def test_auto_with_a_bwrap_that_cannot_sandbox_offers_no_run_command_and_runs_nothing(
    closed: tuple[Stack, Path], llm: ScriptedLLMServer,
) -> None:
    stack, ws = closed
    offered, result, _ = turn(stack, llm,
                              f"touch {ws}/ran; cat /proc/{stack.workers[0].pid}/environ")
    assert "run_command" not in offered and "read_file" in offered, offered
    assert result.startswith(
        "Error: run_command is not available on this worker: commands run only inside "
        "bubblewrap (FERMIX_SANDBOX=auto or bwrap), and bwrap cannot create its namespaces "
        "here: bwrap: No permissions to creating new namespace"), result
    assert "Nothing was run" in result and SECRET not in result
    assert not (ws / "ran").exists()


def test_status_and_doctor_say_the_sandbox_is_unavailable(closed: tuple[Stack, Path]) -> None:
    stack, _ = closed
    with stack.http() as http:
        (worker,) = http.get("/v1/status").json()["workers"]
    sandbox = worker["sandbox"]
    assert sandbox["mode"] == "auto" and sandbox["state"] == "unavailable"
    assert sandbox["runCommand"] is False
    assert "No permissions to creating new namespace" in sandbox["detail"]
    doctor = subprocess.run([sys.executable, "-m", "fermix_cli", "doctor", "--json"],
                            env=stack.env, capture_output=True, text=True, timeout=60)
    (line,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "sandbox"]
    assert line["level"] == "warn" and "run_command is not offered" in line["message"]
    assert "FERMIX_SANDBOX=none" in line["fix"]
    log = (stack.logs / "sandbox-closed-w1.log").read_text()
    assert "WARNING" in log and "run_command is not offered on this worker" in log


def test_none_runs_on_the_host_without_the_worker_s_secrets(
    unsandboxed: tuple[Stack, Path], llm: ScriptedLLMServer,
) -> None:
    stack, ws = unsandboxed
    pid = stack.workers[0].pid
    offered, result, _ = turn(stack, llm, f"env; cat /proc/{pid}/environ; echo; touch ran")
    assert "run_command" in offered
    assert result.startswith("exit code ") and (ws / "ran").exists(), result
    assert SECRET not in result and "FERMIX_" not in result and "API_KEY" not in result
    assert (f"cat: /proc/{pid}/environ: No such file or directory" in result
            or f"cat: /proc/{pid}/environ: Permission denied" in result), result
    with stack.http() as http:
        (worker,) = http.get("/v1/status").json()["workers"]
    assert worker["sandbox"]["state"] == "none" and worker["sandbox"]["runCommand"] is True
    assert "unsandboxed by FERMIX_SANDBOX=none" in worker["sandbox"]["detail"]
