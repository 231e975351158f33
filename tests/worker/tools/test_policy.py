"""Tool scopes: guests see read-only tools, operators see all; allowed lists only narrow."""

from __future__ import annotations

from typing import Any

from fermix_shared.messages import ToolCall
from fermix_worker.tools import (
    GUEST,
    OPERATOR,
    RunContext,
    Tool,
    ToolRegistry,
    ToolResult,
    ToolScope,
)
from fermix_worker.tools.policy import PolicyClass


def tool(name: str, policy: PolicyClass) -> Tool:
    def run(ctx: RunContext, args: dict[str, Any]) -> str:
        return f"{name} ran"

    return Tool(name, f"the {name} tool", {"type": "object", "properties": {}}, run, policy)


REGISTRY = ToolRegistry([
    tool("read", "read_only"),
    tool("write", "read_write"),
    tool("shell", "exec"),
    tool("fetch", "network"),
    tool("github", "external_api"),
    tool("click", "gui_control"),
])


def names(registry: ToolRegistry) -> list[str]:
    return [s.name for s in registry.specs()]


def run(registry: ToolRegistry, name: str) -> ToolResult:
    return registry.execute(ToolCall(id="c1", name=name, arguments={}), RunContext())


def test_guest_sees_and_runs_only_read_only_tools() -> None:
    guest = REGISTRY.scoped(GUEST)
    assert names(guest) == ["read"]
    assert run(guest, "read") == ToolResult("read ran")
    assert guest.get("write") is None
    assert run(guest, "write") == ToolResult(
        "Error: tool 'write' is not available here (needs read_write access; caller is guest).",
        is_error=True,
    )
    assert run(guest, "shell").content.endswith("(needs exec access; caller is guest).")


def test_operator_sees_every_policy_class() -> None:
    operator = REGISTRY.scoped(OPERATOR)
    assert names(operator) == ["read", "write", "shell", "fetch", "github", "click"]
    assert run(operator, "shell") == ToolResult("shell ran")


def test_unknown_tool_is_still_unknown_in_a_scope() -> None:
    assert run(REGISTRY.scoped(GUEST), "nope") == ToolResult(
        "Error: unknown tool 'nope'", is_error=True
    )


def test_allowed_tools_none_is_trust_default_empty_is_none_list_is_exact() -> None:
    assert names(REGISTRY.scoped(ToolScope("operator", allowed_tools=None))) == names(
        REGISTRY.scoped(OPERATOR)
    )
    nothing = REGISTRY.scoped(ToolScope("operator", allowed_tools=()))
    assert names(nothing) == []
    assert run(nothing, "read") == ToolResult(
        "Error: tool 'read' is not in this agent's allowed tools.", is_error=True
    )
    exact = REGISTRY.scoped(ToolScope("operator", allowed_tools=("fetch", "shell")))
    assert names(exact) == ["shell", "fetch"]
    assert run(exact, "shell") == ToolResult("shell ran")
    assert run(exact, "write").is_error


def test_allowed_tools_cannot_widen_guest_trust() -> None:
    guest = REGISTRY.scoped(ToolScope("guest", allowed_tools=("read", "shell")))
    assert names(guest) == ["read"]
    assert run(guest, "shell") == ToolResult(
        "Error: tool 'shell' is not available here (needs exec access; caller is guest).",
        is_error=True,
    )


def test_policy_classes_narrow_within_trust() -> None:
    net_only = REGISTRY.scoped(ToolScope("operator", policies=frozenset({"network", "read_only"})))
    assert names(net_only) == ["read", "fetch"]
    # Naming a class the trust level lacks does not grant it.
    guest = REGISTRY.scoped(ToolScope("guest", policies=frozenset({"exec", "read_only"})))
    assert names(guest) == ["read"]


def test_subagent_gets_parent_classes_minus_read_write_and_gui_control() -> None:
    sub = OPERATOR.for_subagent()
    assert sub.trust == "operator"
    assert names(REGISTRY.scoped(sub)) == ["read", "shell", "fetch", "github"]
    assert run(REGISTRY.scoped(sub), "write").content == (
        "Error: tool 'write' is not available here (needs read_write access; caller is operator)."
    )
    narrowed = ToolScope("operator", policies=frozenset({"read_only", "read_write", "network"}))
    assert names(REGISTRY.scoped(narrowed.for_subagent())) == ["read", "fetch"]
    assert names(REGISTRY.scoped(GUEST.for_subagent())) == ["read"]
    assert names(REGISTRY.scoped(OPERATOR.for_subagent(("fetch", "write")))) == ["fetch"]


def test_scoped_views_nest_by_narrowing_and_leave_the_base_alone() -> None:
    view = REGISTRY.scoped(OPERATOR).scoped(ToolScope("operator", allowed_tools=("read", "write")))
    assert names(view) == ["read", "write"]
    assert names(view.scoped(GUEST)) == ["read"]
    assert len(names(REGISTRY)) == 6


def test_arguments_are_checked_after_permission() -> None:
    guest = REGISTRY.scoped(GUEST)
    bad = ToolCall(id="c1", name="shell", arguments={"_unparsed": "{"})
    assert "not available here" in guest.execute(bad, RunContext()).content
