"""The skill registry over HTTP, as ``fermix skills list | reload`` shows and reloads it
(fermix_shared/skills/):

* ``GET /v1/skills`` (any role): the registry's ``version``, every skill (name, description,
  trust, root, source file) and the files that could not be loaded with why (``issues``),
  built as ``GET /v1/status``'s ``available_skills`` is: created skills from Redis, disk
  roots as this gateway's ``$FERMIX_HOME`` sees them;
* ``POST /v1/skills/reload`` (admin): bump the fleet-wide registry version, so every worker
  rescans its skill roots by its next turn; audited (``admin``, ``skill.reload``, as the CLI
  and the ``skill_reload`` tool record it) with the caller's token and the new version.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from fermix_gateway.api.admin_bodies import SkillRegistry
from fermix_gateway.api.status import skills_snapshot
from fermix_gateway.api.wire import v1_router
from fermix_gateway.auth import Admin
from fermix_shared import audit, keys
from fermix_shared.skills import SkillSnapshot

router = v1_router()


def registry_json(snap: SkillSnapshot) -> dict[str, Any]:
    """The snapshot's wire shape (``fermix skills list --json``'s fields)."""
    return {
        "version": snap.version,
        "skills": [{"name": s.name, "description": s.description, "trust": s.trust,
                    "root": s.root, "source": s.source} for s in snap.visible("operator")],
        "issues": [{"source": i.source, "root": i.root, "error": i.error} for i in snap.issues],
    }


@router.get("/skills", response_model=SkillRegistry)
async def list_skills(request: Request) -> dict[str, Any]:
    """Every skill with its trust and root, and the files not loaded with why."""
    r, settings = request.app.state.redis, request.app.state.settings
    return registry_json(await skills_snapshot(r, settings))


@router.post("/skills/reload", response_model=SkillRegistry)
async def reload_skills(request: Request, who: Admin) -> dict[str, Any]:
    """Make every worker rescan its skills by its next turn; the registry as of the new
    version (as this gateway's roots show it)."""
    r, settings = request.app.state.redis, request.app.state.settings
    version = int(await r.incr(keys.skills_version()))
    await audit.arecord(r, "admin", "skill.reload", "ok", actor=who.actor,
                        version=str(version))
    return registry_json(await skills_snapshot(r, settings))
