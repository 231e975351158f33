"""Every tool call has a wall-clock bound: a tool that runs too long becomes an error result the
model reads, and the turn goes on. Both ways of abandoning a call are exercised: a thread left
behind (threads/solo pools) and an interrupted greenlet (gevent, the worker's default pool)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from fermix_shared.messages import ToolCall
from fermix_worker.loop import AgentLoop, Final
from fermix_worker.providers.base import ModelTurn
from fermix_worker.tools.base import DEFAULT_TOOL_TIMEOUT_S, RunContext, Tool, ToolRegistry
from tests.worker.test_loop import Recorder, ReplayProvider, state

SLOW = {"type": "object", "properties": {}}


def sleeper(seconds: float, **kw: object) -> Tool:
    return Tool("slow_lookup", "sleeps", SLOW, lambda ctx, args: (time.sleep(seconds), "late")[1], **kw)  # type: ignore[arg-type]


def test_the_default_bound_is_120_s() -> None:
    assert DEFAULT_TOOL_TIMEOUT_S == 120.0


def test_a_tool_past_the_registry_bound_is_an_error_result_not_a_hung_turn() -> None:
    registry = ToolRegistry([sleeper(30)], timeout_s=0.3)
    began = time.monotonic()
    result = registry.execute(ToolCall(id="1", name="slow_lookup"), RunContext())
    assert time.monotonic() - began < 1.5
    assert result.is_error
    assert result.content.startswith("Error: slow_lookup did not finish within 0.3 s and was abandoned.")


def test_a_tool_may_set_its_own_bound() -> None:
    registry = ToolRegistry([sleeper(30, timeout_s=0.2)], timeout_s=60)
    began = time.monotonic()
    assert "within 0.2 s" in registry.execute(ToolCall(id="1", name="slow_lookup"),
                                              RunContext()).content
    assert time.monotonic() - began < 1.5
    quick = ToolRegistry([sleeper(0.01)], timeout_s=5).execute(ToolCall(id="2", name="slow_lookup"),
                                                               RunContext())
    assert (quick.content, quick.is_error) == ("late", False)


def test_the_model_sees_the_timeout_and_the_turn_finishes() -> None:
    provider = ReplayProvider([
        ModelTurn("", [ToolCall(id="c1", name="slow_lookup")]),
        ModelTurn("The lookup timed out, sorry.", []),
    ])
    st = state("go")
    out = AgentLoop(provider, ToolRegistry([sleeper(30)], timeout_s=0.2), Recorder()).run(st)
    assert out == Final("The lookup timed out, sorry.")
    tool_msg = next(m for m in st.messages if m.role == "tool")
    assert tool_msg.is_error and "did not finish within 0.2 s" in tool_msg.content


def test_under_gevent_the_call_is_interrupted_where_it_blocks() -> None:
    script = textwrap.dedent("""
        from gevent import monkey; monkey.patch_all()
        import socket, time
        from fermix_shared.messages import ToolCall
        from fermix_worker.tools.base import RunContext, Tool, ToolRegistry

        def blocked(ctx, args):
            a, b = socket.socketpair()
            a.recv(1)  # never answered
            return "never"

        reg = ToolRegistry([Tool("blocked", "d", {"type": "object"}, blocked)], timeout_s=0.3)
        t = time.monotonic()
        r = reg.execute(ToolCall(id="1", name="blocked"), RunContext())
        print(round(time.monotonic() - t, 2), r.is_error, r.content)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    took, is_error, content = out.stdout.strip().split(" ", 2)
    assert float(took) < 1.0 and is_error == "True"
    assert content.startswith("Error: blocked did not finish within 0.3 s")
