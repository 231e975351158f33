"""Who may call which tool: policy classes, caller trust, and the scope that combines them.

A guest sees only ``read_only`` tools; an operator sees every class. An agent's allowed-tool
list and a set of allowed policy classes (subagents: the parent's minus ``read_write`` and
``gui_control``) narrow that further, never widen it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from fermix_shared.models import PolicyClass as PolicyClass
from fermix_shared.models import Trust

if TYPE_CHECKING:
    from fermix_worker.tools.base import Tool

ALL_POLICIES: frozenset[PolicyClass] = frozenset(get_args(PolicyClass))
TRUST_POLICIES: dict[Trust, frozenset[PolicyClass]] = {
    "operator": ALL_POLICIES,
    "guest": frozenset({"read_only"}),
}
# What a subagent may never do, whatever its parent may (seed: "minus :read_write and
# :gui_control"): it cannot write local state or drive the parent's screen.
SUBAGENT_DENIED: frozenset[PolicyClass] = frozenset({"read_write", "gui_control"})


@dataclass(frozen=True)
class ToolScope:
    """What one caller may use.

    ``allowed_tools``: ``None`` = the trust default, ``()`` = no tools, ``(names...)`` = exactly
    those (still within trust). ``policies``: ``None`` = the trust default, else only these
    classes (still within trust). ``has_chat``: False where the conversation has no chat to
    send into (HTTP, a scheduled run that delivers nowhere): tools whose success is a reply in
    the chat (``react``, ``send_message``) are not offered.
    """

    trust: Trust
    allowed_tools: tuple[str, ...] | None = None
    policies: frozenset[PolicyClass] | None = None
    has_chat: bool = True

    def effective_policies(self) -> frozenset[PolicyClass]:
        """The policy classes this caller may actually use (trust ∩ ``policies``)."""
        base = TRUST_POLICIES[self.trust]
        return base if self.policies is None else base & self.policies

    def denial(self, tool: Tool) -> str | None:
        """Why ``tool`` is refused, as the error the model reads; ``None`` if permitted."""
        if tool.operator_only and self.trust != "operator":
            return f"Error: tool '{tool.name}' is not available here (operators only)."
        if tool.policy not in self.effective_policies():
            return (
                f"Error: tool '{tool.name}' is not available here "
                f"(needs {tool.policy} access; caller is {self.trust})."
            )
        if self.allowed_tools is not None and tool.name not in self.allowed_tools:
            return f"Error: tool '{tool.name}' is not in this agent's allowed tools."
        if tool.delivers is not None and not self.has_chat:
            return (f"Error: tool '{tool.name}' is not available here (this conversation has no "
                    "chat to send into; put it in your reply).")
        return None

    def permits(self, tool: Tool) -> bool:
        """True when this caller may see and call ``tool``."""
        return self.denial(tool) is None

    def for_subagent(self, allowed_tools: tuple[str, ...] | None = None) -> ToolScope:
        """The scope of a subagent spawned by this caller: same trust, the parent's policy
        classes minus ``read_write`` and ``gui_control``, and the parent's tool list narrowed
        by the subagent's own (``allowed_tools``; it never adds a name the parent lacks)."""
        return ToolScope(
            trust=self.trust,
            allowed_tools=narrowed(self.allowed_tools, allowed_tools),
            policies=self.effective_policies() - SUBAGENT_DENIED,
        )


def narrowed(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Two allowed-tool lists combined (``None`` = no list): only the names both allow."""
    if a is None or b is None:
        return b if a is None else a
    return tuple(t for t in a if t in b)


OPERATOR = ToolScope("operator")
GUEST = ToolScope("guest")
