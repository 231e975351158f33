"""Response bodies of the operators' views: agents, status, fleet and audit (tokens, scheduled
jobs and skills: ``admin_bodies``; usage and budgets: ``usage_bodies``). camelCase on the wire
but where DESIGN.md's status contract keeps the seed's names; times in ms since the epoch."""

from __future__ import annotations

from typing import Literal

from fermix_gateway.api.admin_bodies import ScheduleShown, Skill, SkillIssue
from fermix_gateway.api.run_bodies import Approval
from fermix_gateway.api.usage_bodies import BudgetState
from fermix_gateway.api.wire import Absent, Body, Number
from fermix_shared.agents.definitions import AgentRole
from fermix_shared.agents.lifecycle import AgentState
from fermix_shared.audit.model import AuditEntry
from fermix_shared.stores.sandbox import SandboxState


class Agent(Body):
    """One agent's entry (``GET /v1/agents``, ``/v1/status``'s ``agents``): ``model`` when it
    has a route of its own; the times when known."""

    name: str
    role: AgentRole
    state: AgentState
    active: int
    pending: int
    model: str | Absent = None
    lastActiveAt: int | Absent = None
    pausedAt: int | Absent = None
    killedAt: int | Absent = None


class Agents(Body):
    """``GET /v1/agents``: every declared agent, ``default`` first."""

    agents: list[Agent]


class AgentResumed(Agent):
    """``POST /v1/agents/{name}/resume``: the entry, and how many conversations it released."""

    released: int


class AgentKilled(AgentResumed):
    """``POST /v1/agents/{name}/kill``: the entry, the running turns stopped and the
    conversations released."""

    stopped: int


class Sandbox(Body):
    """How a worker runs commands, as it reported at start."""

    mode: Literal["auto", "bwrap", "none"]
    state: SandboxState
    detail: str
    limits: str
    runCommand: bool


class WorkerSeen(Body):
    """A worker whose heartbeat is recent: seconds since it beat, its sandbox (or null)."""

    name: str
    lastSeenAgo: Number
    sandbox: Sandbox | None


class Memory(Body):
    """Long-term memory as configured."""

    activeFacts: int
    maxActiveFacts: int
    recallTop: int
    ranking: Literal["embeddings", "full-text"]
    embeddingModel: str | None
    filesDir: str
    files: list[str]
    reviewQuietSeconds: Number
    reviewBatchTurns: int


class ConversationActivity(Body):
    """A conversation with an active turn or waiting messages (the lease in seconds, negative
    once lapsed; null without an active turn)."""

    conversation: str
    active: bool
    leaseExpiresIn: Number | None
    pending: int


class Status(Body):
    """``GET /v1/status``: the queue's counts (also under the seed's snake_case names), the
    workers, the route chain, memory, skills, agents, pending approvals, budgets, scheduled
    jobs and active conversations."""

    activeConversations: int
    pendingConversations: int
    activeRequests: int
    pendingRequests: int
    active_conversations: int
    pending_conversations: int
    active_requests: int
    pending_requests: int
    workers: list[WorkerSeen]
    workersSeen: int
    primary_provider: str
    model: str
    fallback_providers: list[str]
    memory: Memory
    available_skills: list[Skill]
    skillIssues: list[SkillIssue]
    skillsVersion: str
    agents: list[Agent]
    pendingApprovals: list[Approval]
    budgets: list[BudgetState]
    schedules: list[ScheduleShown]
    conversations: list[ConversationActivity]


class FleetWorker(Body):
    """A worker process: heartbeat age (null once it said it stopped), slots, turns."""

    process: str
    node: str
    heartbeatAgoMs: int | None
    stopped: bool
    slots: int | None
    turnsInFlight: int


class FleetGateway(Body):
    """A gateway process seen lately."""

    name: str
    seenAgoMs: int
    startedAt: int


class Beat(Body):
    """Whether a beat holds the leader's lock, and for how long yet."""

    leader: bool
    lockExpiresInMs: int


class RedisShown(Body):
    """The Redis server the gateway talks to (``INFO``), and the Sentinel master followed."""

    role: str | None
    replicas: int
    usedMemory: str | None
    version: str | None
    aof: bool
    lastSaveAt: int | None
    uptimeSeconds: int | None
    sentinel: str | None


class TurnsInMinute(Body):
    """Turns that ended in one minute (its start in ms), by outcome."""

    minute: int
    ok: int
    error: int
    stopped: int


class QueueCounts(Body):
    """The queue's counts."""

    activeConversations: int
    pendingConversations: int
    pendingRequests: int


class Fleet(Body):
    """``GET /v1/fleet``: the fleet now."""

    workers: list[FleetWorker]
    gateways: list[FleetGateway]
    beat: Beat
    redis: RedisShown
    turnsPerMinute: list[TurnsInMinute]
    queue: QueueCounts


class ChainPoint(Body):
    """A position in the audit chain and the hash there."""

    seq: int
    hash: str


class AuditPage(Body):
    """``GET /v1/audit/recent``: entries newest first (as stored), the chain's head (null
    when empty) and anchor."""

    entries: list[AuditEntry]
    head: ChainPoint | None
    anchor: ChainPoint


class AuditVerified(Body):
    """``GET /v1/audit/verify``: whether the chain holds, from its anchor to its head."""

    ok: bool
    checked: int
    problem: str | None
    summary: str
