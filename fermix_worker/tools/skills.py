"""The skill tools: ``skill_list``, ``skill_view``, ``skill_create`` and ``skill_reload``.

Listing and viewing are ``read_only``, and show a caller only the skills its trust may see
(guests: guest-trust skills). Creating and reloading change what the whole fleet uses
(``read_write``: operators only). A guest-trust skill's body is text from a plugin, so it goes
back to the model inside the ``<untrusted_tool_result>`` fence.

The fifth, ``skill_run``, runs a skill as a bounded worker agent on the fleet. It is a fan-out
tool (the turn parks while it runs), so it lives with the subagents:
:mod:`fermix_worker.subagents.skill_tool` (the tool) and
:mod:`fermix_worker.subagents.skill_run` (what a name resolves to, the job, the result).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fermix_shared import audit
from fermix_shared.models import Trust
from fermix_shared.skills import (
    SkillExists,
    SkillParseError,
    SkillRegistry,
    render_skill,
)
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.fence import fence

_LIST_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}
_VIEW_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}
_CREATE_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "lowercase letters, digits, '-' or '_'"},
        "description": {"type": "string", "description": "one line: when the skill helps"},
        "instructions": {"type": "string", "description": "the steps, in Markdown"},
        "allowed_tools": {"type": "array", "items": {"type": "string"}},
        "model": {"type": "string"},
        "replace": {"type": "boolean", "description": "overwrite a skill of the same name"},
    },
    "required": ["name", "description", "instructions"],
}
_RELOAD_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}


def _caller_trust(ctx: RunContext) -> Trust:
    return ctx.trust or "guest"  # neither a turn nor a subagent: fail closed


def _str(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    return value.strip() if isinstance(value, str) else ""


class SkillTools:
    """The four skill tools over the registry ``registry`` returns (called per call)."""

    def __init__(self, registry: Callable[[], SkillRegistry]):
        self._registry = registry

    def list_skills(self, ctx: RunContext, args: dict[str, Any]) -> str:
        skills = self._registry().current().visible(_caller_trust(ctx))
        if not skills:
            return "No skills are available."
        return "\n".join(f"{s.name} ({s.trust}, {s.root}): {s.description}" for s in skills)

    def view_skill(self, ctx: RunContext, args: dict[str, Any]) -> str:
        name = _str(args, "name")
        skill = self._registry().current().get(name, _caller_trust(ctx))
        if skill is None:
            raise ToolError(f"no skill named {name!r}; skill_list shows the available ones")
        body = f"# {skill.name}\n{skill.description}\n\n{skill.instructions}"
        return body if skill.trust == "operator" else fence("skill_view", body)

    def create_skill(self, ctx: RunContext, args: dict[str, Any]) -> str:
        tools = args.get("allowed_tools")
        if tools is not None and not (
                isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
            raise ToolError("allowed_tools must be a list of tool names")
        text = render_skill(_str(args, "name"), _str(args, "description"),
                            _str(args, "instructions"), tools, _str(args, "model") or None)
        try:
            skill, disk_error = self._registry().create(text, replace=args.get("replace") is True)
        except (SkillParseError, SkillExists) as e:
            ctx.audit.record("admin", "skill.create", "error", skill=_str(args, "name"))
            raise ToolError(str(e)) from e
        ctx.audit.record("admin", "skill.create", "ok", skill=skill.name,
                         replace=args.get("replace") is True, text_sha256=audit.text_digest(text))
        note = f" (not written on this host's disk: {disk_error})" if disk_error else ""
        return (f"Created skill '{skill.name}'; every worker uses it from its next turn"
                f"{note}.")

    def reload_skills(self, ctx: RunContext, args: dict[str, Any]) -> str:
        snap = self._registry().reload()
        ctx.audit.record("admin", "skill.reload", "ok", version=snap.version,
                         skills=len(snap.skills), issues=len(snap.issues))
        issues = "".join(f"\n- {i.source}: {i.error}" for i in snap.issues)
        return (f"Skill registry reloaded (version {snap.version}): {len(snap.skills)} skills, "
                f"{len(snap.issues)} not loaded{':' if issues else '.'}{issues}")

    def tools(self) -> list[Tool]:
        return [
            Tool("skill_list", "List the skills you may use: name, trust, root and description.",
                 _LIST_PARAMS, self.list_skills),
            Tool("skill_view", "Read a skill's instructions by name.", _VIEW_PARAMS, self.view_skill),
            Tool("skill_create", (
                "Create a skill (a SKILL.md) for the whole fleet: every worker sees it from its "
                "next turn."
            ), _CREATE_PARAMS, self.create_skill, policy="read_write", idempotent=False),
            Tool("skill_reload", (
                "Rescan every skill root on every worker (after a SKILL.md was added or edited "
                "on disk)."
            ), _RELOAD_PARAMS, self.reload_skills, policy="read_write"),
        ]


def skill_tools(registry: Callable[[], SkillRegistry]) -> list[Tool]:
    """The four skill tools (see :class:`SkillTools`)."""
    return SkillTools(registry).tools()
