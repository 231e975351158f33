"""The agents' lifecycle for operators: ``GET /v1/agents``, ``POST /v1/agents/{name}/pause``,
``POST /v1/agents/{name}/resume`` and ``POST /v1/agents/{name}/kill``
(fermix_shared/agents/lifecycle.py says what they mean).

Each answers with agent entries as ``/v1/status`` lists them: ``{"name", "role", "state",
"active", "pending"}``, plus ``"model"`` when the agent has its own route, ``"lastActiveAt"``,
``"pausedAt"`` and ``"killedAt"`` (ms) when known. Pausing or killing an agent that is not
declared is 404; a ``sub`` agent (it runs only inside other agents' turns) cannot be paused or
killed (409), nor can a killed agent be paused or resumed (409). Resume and kill dispatch every
conversation the pause held; a dispatch that cannot be sent is left to the reaper, which kicks
conversations that wait too long once no pause holds them.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from fastapi import HTTPException, Request

from fermix_gateway import approval_answers
from fermix_gateway.api.fleet_bodies import Agent, AgentKilled, AgentResumed, Agents
from fermix_gateway.api.wire import refusals, v1_router
from fermix_gateway.auth import Admin, Operator
from fermix_shared import audit, keys
from fermix_shared.agents import lifecycle as agents
from fermix_shared.agents.definitions import AgentDefinition, agent_named, agent_names
from fermix_shared.provider_routes import chain_from_settings
from fermix_shared.settings import Settings
from fermix_shared.stores.lease import now_ms
from fermix_shared.stores.status import AgentActivity, queue_status
from fermix_shared.task_names import DISPATCH_TASK

log = logging.getLogger(__name__)
router = v1_router()
REFUSED = refusals({404: "No agent of that name is declared (the reason lists them).",
                    409: "A `sub` agent, or a killed one (which cannot be paused or resumed)."})


def agent_json(a: AgentActivity, settings: Settings) -> dict[str, Any]:
    """One agent's entry (also in ``GET /v1/status``'s ``agents``)."""
    definition = agent_named(settings.agents, a.name)
    out: dict[str, Any] = {
        "name": a.name,
        "role": definition.role if definition else "main",
        "state": a.state,
        "active": a.active,
        "pending": a.pending,
    }
    if definition is not None:
        primary = chain_from_settings(settings)[0]
        if (route := definition.route(primary.provider, primary.model)) is not None:
            out["model"] = route
    if a.last_active_at is not None:
        out["lastActiveAt"] = a.last_active_at
    if a.paused_at is not None:
        out["pausedAt"] = a.paused_at
    if a.killed_at is not None:
        out["killedAt"] = a.killed_at
    return out


async def agent_activity(r: aioredis.Redis, settings: Settings) -> list[AgentActivity]:
    """Every declared agent, ``default`` first."""
    return list((await queue_status(r, agents=agent_names(settings.agents),
                                    declared=settings.agents)).agents)


async def _entry(request: Request, name: str) -> dict[str, Any]:
    r, settings = request.app.state.redis, request.app.state.settings
    (one,) = (await queue_status(r, agents=[name], declared=settings.agents)).agents
    return agent_json(one, settings)


async def _main_agent(request: Request, name: str, verb: str) -> AgentDefinition:
    """The declared ``main`` agent ``name`` (not killed, unless ``verb`` is ``kill``), else
    the HTTP refusal."""
    r, settings = request.app.state.redis, request.app.state.settings
    definition = agent_named(settings.agents, name)
    if definition is None:
        raise _unknown(settings, name)
    if definition.role != "main":
        raise HTTPException(409, f"agent {name!r} has role 'sub': it runs only inside other "
                                 f"agents' turns, {verb} those instead")
    if verb != "kill" and await agents.killed_async(r, name, definition) is not None:
        raise _killed(name)
    return definition


def _killed(name: str) -> HTTPException:
    return HTTPException(409, f"agent {name!r} was killed: it takes no turns until its "
                              "definition is re-created (declared again with a change)")


def _unknown(settings: Settings, name: str) -> HTTPException:
    return HTTPException(404, f"no agent named {name!r} (agents: "
                              f"{', '.join(agent_names(settings.agents))})")


@router.get("/agents", response_model=Agents)
async def list_agents(request: Request) -> dict[str, Any]:
    r, settings = request.app.state.redis, request.app.state.settings
    return {"agents": [agent_json(a, settings) for a in await agent_activity(r, settings)]}


@router.post("/agents/{name}/pause", response_model=Agent, responses=REFUSED)
async def pause_agent(name: str, request: Request,
                      who: Operator) -> dict[str, Any]:
    """Pause: its messages keep being accepted and queue; no new turn of it starts."""
    r = request.app.state.redis
    await _main_agent(request, name, "pause")
    await agents.pause_async(r, name, now_ms())
    await audit.arecord(r, "agent", "agent.pause", "ok", actor=who.actor, agent=name)
    log.info("agent %s paused", name)
    return await _entry(request, name)


@router.post("/agents/{name}/resume", response_model=AgentResumed, responses=REFUSED)
async def resume_agent(name: str, request: Request,
                       who: Operator) -> dict[str, Any]:
    """Resume: the conversations its pause held are dispatched again and run in order.
    ``released`` says how many. An agent no longer declared can still be resumed while it is
    paused, so that nothing it held stays queued."""
    r, settings = request.app.state.redis, request.app.state.settings
    definition = agent_named(settings.agents, name)
    if definition is None and not await r.hexists(keys.agents_paused(), name):
        raise _unknown(settings, name)
    if definition is not None and await agents.killed_async(r, name, definition) is not None:
        raise _killed(name)
    resumed = await agents.resume_async(r, name)
    await audit.arecord(r, "agent", "agent.resume", "ok", actor=who.actor, agent=name,
                        was_paused=resumed.was_paused, released=len(resumed.conversations))
    if resumed.conversations:
        await _dispatch(request, resumed.conversations)
    if resumed.was_paused:
        log.info("agent %s resumed; %d conversation(s) released", name,
                 len(resumed.conversations))
    return {**await _entry(request, name), "released": len(resumed.conversations)}


@router.post("/agents/{name}/kill", response_model=AgentKilled, responses=REFUSED)
async def kill_agent(name: str, request: Request,
                     who: Admin) -> dict[str, Any]:
    """Kill, for good: its running turns are stopped (their subagents with them) and every
    message of it is refused with a reply, until its definition is re-created. ``stopped``
    says how many running turns it stopped, ``released`` how many conversations its pause
    held. Killing it again changes nothing (the first ``killedAt`` stays)."""
    r = request.app.state.redis
    definition = await _main_agent(request, name, "kill")
    done = await agents.kill_async(r, definition, now_ms())
    await audit.arecord(r, "agent", "agent.kill", "ok", actor=who.actor, agent=name,
                        fingerprint=done.kill.fingerprint, again=done.again,
                        stopped=len(done.stopped), released=len(done.released))

    async def send(task: str, args: list[str]) -> None:
        request.app.state.tasks.send(task, args)

    for conv in done.stopped:  # a turn parked on an approval ends now, not at its answer
        await approval_answers.cancel_pending(r, send, conv, who.actor)
    await _dispatch(request, done.released)
    if not done.again:
        log.warning("agent %s killed: %d running turn(s) stopped, %d conversation(s) released",
                    name, len(done.stopped), len(done.released))
    return {**await _entry(request, name), "stopped": len(done.stopped),
            "released": len(done.released)}


async def _dispatch(request: Request, convs: list[str]) -> None:
    # A lost kick is harmless: no longer held, the reaper kicks it once it has waited a lease.
    for conv in convs:
        request.app.state.tasks.send(DISPATCH_TASK, [conv])
