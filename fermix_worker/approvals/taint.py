"""The taint check: untrusted content must not steer a privileged call unseen.

OpenFang checks every tool call for it: "Taint check: Ensure no untrusted data flows into
privileged operations". Here a turn is *tainted* once it has taken in a fenced external result
(a network, external-API or MCP tool: see ``Tool.external``); the loop records the
first such tool in the turn's state (``LoopState.taint``), which survives checkpoints and
resumes. From then on, calls of the configured policy classes (``[taint] policies``, default
``exec`` and ``read_write``) are gated per ``[taint] mode``:

* ``approval`` (default): the call waits for a person's approval, like an ``[approvals]``
  call, even when its tool normally runs without one; the question says why;
* ``refuse``: the call is refused with :data:`TAINT_REFUSAL`;
* ``off``: no gate.

A subagent has nobody to ask: there ``approval`` refuses too. Every gate is an audit entry
(a ``check`` named ``taint``). Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

from fermix_shared.settings import TaintConfig
from fermix_worker.tools.base import Tool

TaintGate = Literal["approval", "refuse"]

TAINT_REASON = (
    "This turn has read untrusted content (from {source}) before this call, so it waits for "
    "a person's approval."
)
TAINT_REFUSAL = (
    "Error: '{tool}' was refused: this turn has read untrusted content (from {source}), and "
    "calls of this kind are not allowed after that. Do not retry it; tell the user what you "
    "would have run."
)


class TaintPolicy:
    """Which calls of a tainted turn are gated, and how (``[taint]``)."""

    def __init__(self, config: TaintConfig, *, can_ask: bool = True):
        self._policies = frozenset(config.policies)
        self._mode = config.mode
        # A subagent cannot park for a person: what would ask is refused there.
        self._can_ask = can_ask

    def gate(self, tool: Tool, source: str | None) -> TaintGate | None:
        """The gate for a call of ``tool`` in a turn tainted by ``source`` (None: untainted)."""
        if source is None or self._mode == "off" or tool.fanout:
            return None
        if tool.policy not in self._policies:
            return None
        return "approval" if self._mode == "approval" and self._can_ask else "refuse"
