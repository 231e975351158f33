"""The HTTP API under ``/v1``: one module per resource, each an ``APIRouter``.

``runs`` (``/v1/agent``, ``/v1/runs``), ``recorder`` (a run's replay and fork), ``evals``
(a case of an eval suite run; a run made a case), ``status``, ``conversations``, ``agents``,
``approvals``, ``audit``,
``usage``, ``tokens`` (named API tokens), ``schedules`` (scheduled jobs), ``skills`` (the
skill registry), and ``openai`` (the OpenAI-compatible ``/v1/chat/completions`` and ``/v1/models``,
its wire types in ``openai_schemas``). ``schemas`` holds the request bodies the routes share;
``run_bodies``, ``fleet_bodies``, ``admin_bodies`` and ``usage_bodies`` the response bodies
each route declares (``response_model``), and ``wire`` what every ``/v1`` route shares in
``/openapi.json``: the error body, and the route class that declares the common refusals.
"""

from __future__ import annotations

from fastapi import APIRouter

from fermix_gateway.api import (
    agents,
    approvals,
    audit,
    conversations,
    evals,
    fleet,
    openai,
    recorder,
    runs,
    schedules,
    skills,
    status,
    tokens,
    usage,
)


def routers() -> list[APIRouter]:
    """Every ``/v1`` router, in the order the app includes them."""
    return [m.router for m in (runs, recorder, evals, status, fleet, conversations, agents, approvals,
                                     audit, usage, tokens, schedules, skills, openai)]
