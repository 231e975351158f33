"""The console's scheduled jobs and skills, over the same stores and ``/v1`` routes a script
uses:

* ``/console/schedules``: every job with its schedule, state, next run and last run (its
  status and when), linking to ``/console/schedules/{name}``: the job's task, limits and kept
  run history. An operator pauses, resumes and runs a job now; an admin deletes one;
* ``/console/skills``: every skill of the registry with its trust and root, the files that
  could not be loaded and why, and for an admin a *Reload* button (every worker rescans).

The buttons are ``static/admin.js`` calling ``/v1/schedules`` and ``/v1/skills`` with the
session's CSRF token; a role that may not act gets no buttons, and the API refuses it anyway.
Times are UTC.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from fermix_gateway.api.schedules import get_schedule, list_schedules
from fermix_gateway.api.skills import list_skills
from fermix_gateway.console.ops_pages import when_text
from fermix_gateway.console.render import page, signed_in, to_login
from fermix_shared.access.tokens import Role, allows

router = APIRouter(prefix="/console", include_in_schema=False)


def when(ms: int | None) -> str:
    """A time in ms as UTC text, or ``-``."""
    return "-" if ms is None else when_text(ms)


def shown(job: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/schedules`` entry with its times as text and its last run at hand."""
    runs = [{**r, "when": when(r["startedAt"] or r["endedAt"]),
             "took": "-" if r["startedAt"] is None
             else f"{(r['endedAt'] - r['startedAt']) / 1000:.1f}s"} for r in job["runs"]]
    return {**job, "runs": runs, "next": when(job["nextRunAt"]),
            "last": runs[0] if runs else None}


def _mays(role: Role) -> dict[str, bool]:
    return {"may_act": allows(role, "operator"), "may_delete": allows(role, "admin")}


@router.get("/schedules")
async def schedules_page(request: Request) -> Response:
    """Every scheduled job, with its next and last run and (by role) its buttons."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    found = await list_schedules(request)
    return page(request, "schedules.html", caller,
                jobs=[shown(j) for j in found["schedules"]], **_mays(caller.role))


@router.get("/schedules/{name}")
async def schedule_page(name: str, request: Request) -> Response:
    """One job: its task, limits and run history."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    try:
        job = await get_schedule(name, request)
    except HTTPException as e:
        return page(request, "error.html", caller, status=e.status_code, error=str(e.detail))
    return page(request, "schedule.html", caller, job=shown(job),
                created=when(job["createdAt"]), expires=when(job["expiresAt"]),
                **_mays(caller.role))


@router.get("/skills")
async def skills_page(request: Request) -> Response:
    """The skill registry: skills with trust and root, and the files not loaded."""
    if (caller := await signed_in(request)) is None:
        return to_login()
    registry = await list_skills(request)
    return page(request, "skills.html", caller, registry=registry,
                may_reload=allows(caller.role, "admin"))
