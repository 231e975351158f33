"""``SKILL.md``: YAML frontmatter between two ``---`` lines, then the instructions.

Frontmatter fields: ``name`` and ``description`` (required), ``allowed_tools`` (a list of tool
names), ``model`` and ``policy`` (policy class names), all optional. Any other key is ignored:
in particular a ``trust`` key means nothing, since a skill's trust comes from the root it was
found in (:mod:`fermix_shared.skills.registry`), never from what the file says about itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

import yaml

from fermix_shared.errors import UserInputError
from fermix_shared.models import Trust

# Where a skill came from. ``created``: written by the ``skill_create`` tool (kept in Redis);
# ``outside``: a file that resolves outside every known root (a symlink out of one).
SkillRoot = Literal["created", "home", "bundled", "plugin", "outside"]

ROOT_TRUST: dict[SkillRoot, Trust] = {
    "created": "operator",  # only operators may call skill_create
    "home": "operator",
    "bundled": "operator",
    "plugin": "guest",
    "outside": "guest",  # fail closed
}

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_DESCRIPTION_CHARS = 300
MAX_SKILL_BYTES = 64 * 1024
_POLICIES = frozenset(
    ("read_only", "read_write", "exec", "network", "external_api", "gui_control"))
assert set(get_args(SkillRoot)) == set(ROOT_TRUST)


class SkillParseError(UserInputError, ValueError):
    """A SKILL.md that cannot be used; the message says what is wrong with it."""


@dataclass(frozen=True)
class Skill:
    """One parsed skill. ``trust`` is computed from ``root`` only."""

    name: str
    description: str
    instructions: str
    root: SkillRoot
    source: str  # the file's path, or ``redis:<name>`` for a created skill
    allowed_tools: tuple[str, ...] | None = None
    model: str | None = None
    policy: tuple[str, ...] | None = None

    @property
    def trust(self) -> Trust:
        return ROOT_TRUST[self.root]


def _split(text: str) -> tuple[str, str]:
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise SkillParseError("missing YAML frontmatter (the file must start with a '---' line)")
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1:])
    raise SkillParseError("frontmatter is not closed by a '---' line")


def _names(meta: dict[str, Any], field: str) -> tuple[str, ...] | None:
    value = meta.get(field)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SkillParseError(f"{field} must be a list of names")
    return tuple(v.strip() for v in value)


def parse_skill(text: str, root: SkillRoot, source: str) -> Skill:
    """The skill in ``text``, found in ``root``; :class:`SkillParseError` when malformed."""
    if len(text.encode()) > MAX_SKILL_BYTES:
        raise SkillParseError(f"larger than {MAX_SKILL_BYTES} bytes")
    head, body = _split(text)
    try:
        meta = yaml.safe_load(head)
    except yaml.YAMLError as e:
        raise SkillParseError(f"frontmatter is not valid YAML: {e}") from None
    if not isinstance(meta, dict):
        raise SkillParseError("frontmatter must be a mapping of fields")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SkillParseError(
            "name must be 1-64 lowercase letters, digits, '-' or '_', starting with a letter "
            "or digit")
    if not isinstance(description, str) or not description.strip():
        raise SkillParseError("description is required")
    description = " ".join(description.split())
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillParseError(f"description is longer than {MAX_DESCRIPTION_CHARS} characters")
    model = meta.get("model")
    if model is not None and not isinstance(model, str):
        raise SkillParseError("model must be a string")
    policy = _names(meta, "policy")
    if policy is not None and (unknown := sorted(set(policy) - _POLICIES)):
        raise SkillParseError(f"unknown policy class {', '.join(unknown)}")
    if not body.strip():
        raise SkillParseError("no instructions after the frontmatter")
    return Skill(name=name, description=description, instructions=body.strip(), root=root,
                 source=source, allowed_tools=_names(meta, "allowed_tools"), model=model,
                 policy=policy)


def render_skill(name: str, description: str, instructions: str,
                 allowed_tools: list[str] | None = None, model: str | None = None) -> str:
    """A SKILL.md's text (what ``skill_create`` writes)."""
    meta: dict[str, Any] = {"name": name, "description": description}
    if allowed_tools is not None:
        meta["allowed_tools"] = allowed_tools
    if model:
        meta["model"] = model
    head = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return f"---\n{head}---\n{instructions.strip()}\n"
