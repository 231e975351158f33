"""Plugin hooks: loading from entry points, mutating chains, and plugins that fail or hang.

Plugins are registered programmatically, and once as a real installed distribution (a
``*.dist-info`` with ``entry_points.txt`` on ``sys.path``), the way ``pip install`` leaves it.
"""

from __future__ import annotations

import logging
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from fermix_shared.hooks import HOOK_NAMES, HookRegistry, attribute_of
from tests.seed_text import seed_text

SECRET = "user said: my password is hunter2"


class Rewriter:
    def before_tool_call(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"arguments": {**payload["arguments"], "path": "/sandbox/" + payload["arguments"]["path"]}}


class Blocker:
    def before_tool_call(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        if payload["tool"] == "exec":
            return {"block": "exec is disabled by policy"}
        return None


class Raiser:
    def before_tool_call(self, payload: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(f"cannot handle {payload['text']}")


class Sleeper:
    def before_tool_call(self, payload: dict[str, Any]) -> dict[str, Any]:
        time.sleep(2)
        return {"block": "too late"}


def test_before_tool_call_rewrites_arguments() -> None:
    reg = HookRegistry()
    reg.register("rewriter", Rewriter())
    out = reg.call("before_tool_call", {"tool": "read", "arguments": {"path": "notes.txt"}})
    assert out == {"tool": "read", "arguments": {"path": "/sandbox/notes.txt"}}


def test_before_tool_call_blocks_and_later_plugins_are_not_called() -> None:
    reg = HookRegistry()
    reg.register("blocker", Blocker())
    reg.register("rewriter", Rewriter())
    out = reg.call("before_tool_call", {"tool": "exec", "arguments": {"path": "x"}})
    assert out["block"] == "exec is disabled by policy"
    assert out["arguments"] == {"path": "x"}  # the rewriter never ran
    allowed = reg.call("before_tool_call", {"tool": "read", "arguments": {"path": "x"}})
    assert "block" not in allowed
    assert allowed["arguments"] == {"path": "/sandbox/x"}


def test_two_plugins_chain_each_sees_the_previous_result() -> None:
    seen: list[str] = []

    class Shout:
        def message_sending(self, payload: dict[str, Any]) -> dict[str, Any]:
            seen.append(payload["text"])
            return {"text": payload["text"].upper()}

    class Sign:
        def message_sending(self, payload: dict[str, Any]) -> dict[str, Any]:
            seen.append(payload["text"])
            return {"text": payload["text"] + " -- fermix"}

    reg = HookRegistry()
    reg.register("a-shout", Shout())
    reg.register("b-sign", Sign())
    out = reg.call("message_sending", {"text": "hello", "chat": "c1"})
    assert out == {"text": "HELLO -- fermix", "chat": "c1"}
    assert seen == ["hello", "HELLO"]


def test_mutations_outside_the_contract_are_dropped() -> None:
    class Sneaky:
        def tool_result_persist(self, payload: dict[str, Any]) -> dict[str, Any]:
            return {"content": 42, "run_id": "other", "extra": "x"}

    reg = HookRegistry()
    reg.register("sneaky", Sneaky())
    payload = {"run_id": "r1", "content": "ok"}
    assert reg.call("tool_result_persist", payload) == payload


def test_raising_hook_is_logged_without_payload_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    reg = HookRegistry()
    reg.register("raiser", Raiser())
    reg.register("rewriter", Rewriter())
    with caplog.at_level(logging.DEBUG, logger="fermix_shared.hooks"):
        out = reg.call("before_tool_call", {"tool": "read", "text": SECRET,
                                            "arguments": {"path": "a"}})
    assert out["arguments"] == {"path": "/sandbox/a"}
    assert "hook before_tool_call of plugin raiser raised ValueError; ignored" in caplog.text
    assert "hunter2" not in caplog.text
    assert all(r.exc_info is None for r in caplog.records)


def test_slow_hook_times_out_and_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    reg = HookRegistry(timeout=0.2)
    reg.register("sleeper", Sleeper())
    start = time.monotonic()
    out = reg.call("before_tool_call", {"tool": "read", "arguments": {}})
    assert time.monotonic() - start < 0.35
    assert "block" not in out
    assert "hook before_tool_call of plugin sleeper timed out after 0.2s" in caplog.text


def test_observer_return_values_are_ignored() -> None:
    calls: list[dict[str, Any]] = []

    class Observer:
        def agent_end(self, payload: dict[str, Any]) -> dict[str, Any]:
            calls.append(payload)
            return {"status": "hijacked"}

    reg = HookRegistry()
    reg.register("observer", Observer())
    payload = {"run_id": "r1", "status": "ok"}
    assert reg.call("agent_end", payload) is payload
    assert payload == {"run_id": "r1", "status": "ok"}
    assert calls == [payload]


def test_has_and_module_plugins() -> None:
    reg = HookRegistry()
    assert not any(reg.has(h) for h in HOOK_NAMES)
    reg.register("funcs", type("M", (), {"session_start": staticmethod(lambda p: None)}))
    assert reg.has("session_start")
    assert not reg.has("session_end")
    assert reg.call("session_end", {"x": 1}) == {"x": 1}


def test_acall_runs_hooks_off_the_event_loop() -> None:
    class Model:
        def before_model_resolve(self, payload: dict[str, Any]) -> dict[str, Any]:
            return {"provider": "anthropic", "model": "claude-x"}

    reg = HookRegistry()
    reg.register("model", Model())

    async def main() -> dict[str, Any]:
        return await reg.acall("before_model_resolve", {"provider": "openai", "model": "m"})

    assert anyio.run(main) == {"provider": "anthropic", "model": "claude-x"}


def test_from_entry_points_finds_an_installed_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pkg = tmp_path / "fakeplugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        class Plugin:
            def tool_result_persist(self, payload):
                return {"content": payload["content"].replace("sk-live-123", "[redacted]")}
    """))
    dist = tmp_path / "fakeplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[fermix.hooks]\nfake = fakeplugin:Plugin\nbroken = fakeplugin_missing:Plugin\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    reg = HookRegistry.from_entry_points(timeout=1.0)
    assert reg.timeout == 1.0
    assert reg.has("tool_result_persist")
    out = reg.call("tool_result_persist", {"tool": "env", "content": "KEY=sk-live-123"})
    assert out["content"] == "KEY=[redacted]"
    assert "hook plugin broken (fakeplugin_missing:Plugin) failed to load" in caplog.text


def test_every_hook_point_the_seed_lists_is_one_a_plugin_can_implement() -> None:
    text = seed_text("S")
    section = text[text.index("## Hook points"):text.index("## Streaming + partial replies")]
    listed = {name for bold in re.findall(r"\*\*(`[^*]+`)\*\*", section)
              for name in re.findall(r"`([^`]+)`", bold)}
    assert {"agent:bootstrap", "before_agent_start", "session_start", "llm_input"} <= listed
    assert listed <= set(HOOK_NAMES)
    # A name with a colon is the attribute with an underscore.
    reg = HookRegistry()
    reg.register("boot", type("P", (), {"agent_bootstrap": staticmethod(lambda p: None),
                                        "command_reset": staticmethod(lambda p: None)}))
    assert reg.has("agent:bootstrap") and reg.has("command:reset")
    assert [attribute_of(h) for h in ("agent:bootstrap", "command:new")] == [
        "agent_bootstrap", "command_new"]
