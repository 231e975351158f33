"""``GET /v1/status``: queue activity, the workers seen (each with its command sandbox, as it
reported at start: fermix_shared/stores/sandbox.py), the provider route chain and the
memory configuration (the seed's ``MainAgent.status``: ``primary_provider``, its
``fallback_providers``, the current ``model``, ``memory``), the ``available_skills``, the
agents with their lifecycle state (as ``GET /v1/agents`` lists them), the tool calls waiting
for approval and the budgets against their spending in the current period (as
``GET /v1/budgets`` lists them), and the scheduled jobs with the agent each runs as (as
``fermix schedule list`` shows them)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from fastapi import Request

from fermix_gateway.api.agents import agent_json
from fermix_gateway.api.approvals import approval_json
from fermix_gateway.api.fleet_bodies import Status
from fermix_gateway.api.wire import v1_router
from fermix_shared import keys
from fermix_shared.agents.definitions import agent_names
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import Approval
from fermix_shared.memory import MAX_ACTIVE_FACTS
from fermix_shared.provider_routes import chain_from_settings
from fermix_shared.scheduling.jobs import Job
from fermix_shared.scheduling.store import jobs_async
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillSnapshot, discover
from fermix_shared.stores import sandbox as sandbox_store
from fermix_shared.stores.status import QueueStatus, queue_status
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import BudgetStatus

router = v1_router()


def provider_json(settings: Settings) -> dict[str, Any]:
    """The route chain as the workers build it from the same settings, under the seed's names:
    ``primary_provider`` and the current ``model`` (the first route), then
    ``fallback_providers`` by route name (``openai/gpt-4.1-mini``), in the order tried."""
    primary, *fallbacks = chain_from_settings(settings)
    return {
        "primary_provider": primary.provider,
        "model": primary.model,
        "fallback_providers": [route.name for route in fallbacks],
    }


async def memory_json(r: aioredis.Redis, settings: Settings) -> dict[str, Any]:
    """Long-term memory as configured: facts in Redis (global to the agent, capped), how many
    join a prompt and how they are ranked (``[memory]``), prompt memory files under
    ``$FERMIX_HOME/memory`` (as this gateway's FERMIX_HOME sees them; each worker reads its own
    at start), and when the background review runs (``memory_review_*``)."""
    folder = settings.home / "memory"
    files = sorted(p.name for p in folder.glob("*.md") if p.is_file()) if folder.is_dir() else []
    memory = settings.memory
    return {
        "activeFacts": int(await r.zcard(keys.memory_active())),
        "maxActiveFacts": MAX_ACTIVE_FACTS,
        "recallTop": memory.recall_top,
        "ranking": "embeddings" if memory.embedding_model else "full-text",
        "embeddingModel": memory.embedding_model,
        "filesDir": str(folder),
        "files": files,
        "reviewQuietSeconds": settings.memory_review_quiet_seconds,
        "reviewBatchTurns": settings.memory_review_batch_turns,
    }


async def skills_snapshot(r: aioredis.Redis, settings: Settings) -> SkillSnapshot:
    """The registry as a worker builds it, from the same roots: tool-created skills from Redis,
    disk roots as this gateway's FERMIX_HOME sees them (keep them identical on every host)."""
    version = await r.get(keys.skills_version())
    created = {str(k): str(v) for k, v in (await r.hgetall(keys.skills_created())).items()}
    return await asyncio.to_thread(discover, settings.home, created, str(version or "0"))


def skills_json(snap: SkillSnapshot) -> dict[str, Any]:
    """Every skill (the status API is the operator's) and the files that could not be loaded.
    ``available_skills`` is spelled as DESIGN.md's status contract (and the seed) name it."""
    return {
        "available_skills": [
            {"name": s.name, "description": s.description, "trust": s.trust, "root": s.root}
            for s in snap.visible("operator")
        ],
        "skillIssues": [{"source": i.source, "root": i.root, "error": i.error}
                        for i in snap.issues],
        "skillsVersion": snap.version,
    }


def schedules_json(jobs: list[Job]) -> list[dict[str, Any]]:
    """Each scheduled job: the agent it runs as (inside that agent's limits) and at which
    trust, its schedule, state and next run (ms, or None)."""
    return [{"name": j.name, "agent": j.agent, "trust": j.trust,
             "schedule": j.schedule.describe(), "state": j.state, "nextRunAt": j.next_run_at,
             "delivery": j.delivery.describe()} for j in jobs]


def status_json(status: QueueStatus, settings: Settings, memory: dict[str, Any],
                skills: SkillSnapshot, waiting: list[Approval] | None = None,
                spending: list[BudgetStatus] | None = None,
                sandbox: dict[str, sandbox_store.SandboxReport] | None = None,
                jobs: list[Job] | None = None) -> dict[str, Any]:
    """The wire shape of ``GET /v1/status`` (camelCase, seconds as numbers). Each worker's
    ``sandbox`` is how it runs commands, as it reported at start (None: it reported none)."""
    return {
        "activeConversations": status.active_conversations,
        "pendingConversations": status.pending_conversations,
        "activeRequests": status.active_requests,
        "pendingRequests": status.pending_requests,
        # The same four under the seed's names (Gateway.Queue.status/1).
        "active_conversations": status.active_conversations,
        "pending_conversations": status.pending_conversations,
        "active_requests": status.active_requests,
        "pending_requests": status.pending_requests,
        "workers": [{"name": w.name, "lastSeenAgo": w.last_seen_ago,
                     "sandbox": sandbox_store.report_json((sandbox or {}).get(w.name))}
                    for w in status.workers],
        "workersSeen": len(status.workers),
        # The seed's MainAgent.status names: primary_provider, fallback_providers, model.
        **provider_json(settings),
        "memory": memory,
        **skills_json(skills),
        "agents": [agent_json(a, settings) for a in status.agents],
        # Tool calls waiting for a person (GET /v1/approvals has the same entries).
        "pendingApprovals": [approval_json(a) for a in waiting or []],
        # Every budget: scope, period, limit, spent, percent, resetsAt (GET /v1/budgets).
        "budgets": budgets.budgets_json(spending or []),
        # Scheduled jobs and the agent each runs as (`fermix schedule list`).
        "schedules": schedules_json(jobs or []),
        "conversations": [
            {
                "conversation": c.conversation,
                "active": c.active,
                "leaseExpiresIn": c.lease_expires_in,
                "pending": c.pending,
            }
            for c in status.conversations
        ],
    }


@router.get("/status", response_model=Status)
async def get_status(request: Request) -> dict[str, Any]:
    r, settings = request.app.state.redis, request.app.state.settings
    status = await queue_status(r, agents=agent_names(settings.agents), declared=settings.agents)
    return status_json(status, settings, await memory_json(r, settings),
                       await skills_snapshot(r, settings), await approvals.pending_async(r),
                       await budgets.statuses_async(r, None, time.time()),
                       await sandbox_store.reports_async(r), await jobs_async(r))
