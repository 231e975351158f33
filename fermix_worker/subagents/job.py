"""SubagentJob: one subagent to run, as its header task carries it to any worker."""

from __future__ import annotations

from typing import Literal

from fermix_shared.models import ConversationKey, PolicyClass, RunProfile, Trust
from fermix_shared.records import VersionedRecord
from fermix_worker.subagents.prompts import ResultFormat
from fermix_worker.subagents.tool import ReasoningEffort

# 2: the skill fields (a reader that ignored them would run a skill with wider tools).
# 3: the parent turn's tool limits (``parent_tools``, ``parent_policies``): a job without
# them would fall back to the trust's defaults, wider than its parent, so it is refused.
JOB_SCHEMA_VERSION = 3


class SubagentJob(VersionedRecord):
    """One subagent to run: the header task's argument (it crosses to any worker)."""

    SCHEMA_VERSION = JOB_SCHEMA_VERSION

    fanout_id: str
    index: int
    task: str
    conv: str
    parent_run: str
    trust: Trust
    profile: RunProfile
    result_format: ResultFormat
    parent_model: str
    # The parent turn's tool limits, never fallen back from: its allowed-tool list (None: no
    # list, its policy classes and trust bound it) and its effective policy classes (trust ∩
    # its agent's ``policy``). The subagent gets these minus what no subagent gets.
    parent_tools: list[str] | None
    parent_policies: list[PolicyClass]
    provider: Literal["anthropic", "openai"] | None = None
    model: str | None = None
    # The call's reasoning effort: OpenAI's reasoning_effort, an Anthropic thinking budget.
    reasoning_effort: ReasoningEffort | None = None
    concurrency: int
    timeout_s: float
    # Unix time by which every subagent of the fan-out must have reported.
    deadline_at: float
    slots_ttl_s: float
    # Set for a ``skill_run`` job: the skill's (or ``sub`` agent's) name, the system prompt
    # that replaces the fixed one (the date is appended), its tool list and policy classes
    # (None: no limit beyond the parent's), its iteration bound (within the caps') and
    # sampling temperature (None: the provider's default). A ``subagents`` job's
    # ``allowed_tools`` is the call's ``tools`` argument (None: not given).
    skill: str = ""
    system: str | None = None
    allowed_tools: list[str] | None = None
    policies: list[PolicyClass] | None = None
    max_iterations: int | None = None
    temperature: float | None = None
    # The parent turn's agent and user: the subagent's model calls are charged to the parent's
    # agent, conversation and user (children's spending counts against the parent's budgets).
    parent_agent: str = "default"
    parent_user: str = ""
    # What the subagent may reach of its parent turn: its workspace root, read and never
    # written (None: it has none), and the chat its approvals are asked in (None: answered
    # through the API). A reader that ignores them reaches less.
    workspace: str | None = None
    ask_in: ConversationKey | None = None
    # The fan-out's span context (fermix_shared/tracing.py): the subagent's span is its child,
    # on whichever worker runs it. A reader that ignores it starts a trace of its own.
    trace: dict[str, str] | None = None
