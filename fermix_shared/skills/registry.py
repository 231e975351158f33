"""Skill discovery and the per-process registry snapshot, refreshed fleet-wide through Redis.

Roots, in precedence order (a name found in an earlier one hides the same name in later ones):

======================================================  =========  ========
root                                                    name       trust
======================================================  =========  ========
``skill_create`` tool (Redis hash ``fx:skills:created``)  created    operator
``$FERMIX_HOME/skills/<name>/SKILL.md``                   home       operator
``fermix_shared/skills/bundled/<name>/SKILL.md``          bundled    operator
``$FERMIX_HOME/plugins/<plugin>/skills/<name>/SKILL.md``  plugin     guest
======================================================  =========  ========

The operator's own skills override the bundled ones; a created skill overrides a disk one of
the same name, so every host resolves a name the same way whatever its disk holds. A file
that resolves outside the root it was found in (a symlink out of it) is ``outside``: guest.
Malformed files are logged and listed as :class:`SkillIssue`; they never raise.

Reload: the version in ``fx:skills:version`` is read (one GET) by :meth:`SkillRegistry.current`
at the start of each turn; a process rescans when it differs from its snapshot's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace as with_fields
from pathlib import Path
from typing import Any

import redis

from fermix_shared import keys
from fermix_shared.errors import UserInputError
from fermix_shared.models import Trust
from fermix_shared.skills.parse import Skill, SkillParseError, SkillRoot, parse_skill

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
SKILL_FILE = "SKILL.md"
# The prompt's list stops here (a skill past it is still reachable through skill_list).
MAX_PROMPT_SKILLS = 50


@dataclass(frozen=True)
class SkillIssue:
    """A skill file that could not be used, and why."""

    source: str
    root: SkillRoot
    error: str


@dataclass(frozen=True)
class SkillSnapshot:
    """The skills one process uses, as of registry ``version``."""

    version: str
    skills: Mapping[str, Skill]
    issues: tuple[SkillIssue, ...] = ()

    def visible(self, trust: Trust) -> list[Skill]:
        """What a caller of ``trust`` may see: operators all, guests guest-trust skills only."""
        return [s for _, s in sorted(self.skills.items())
                if trust == "operator" or s.trust == "guest"]

    def get(self, name: str, trust: Trust) -> Skill | None:
        skill = self.skills.get(name)
        return skill if skill is not None and (trust == "operator" or skill.trust == "guest") \
            else None


def skill_dirs(home: Path) -> tuple[Path, Path]:
    """``$FERMIX_HOME/skills`` and ``$FERMIX_HOME/plugins``."""
    return home / "skills", home / "plugins"


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def _scan(folder: Path, root: SkillRoot, fence: Path) -> tuple[list[Skill], list[SkillIssue]]:
    """Every ``<folder>/<name>/SKILL.md``; a file resolving outside ``fence`` is ``outside``."""
    skills: list[Skill] = []
    issues: list[SkillIssue] = []
    try:
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError as e:
        return [], [SkillIssue(str(folder), root, f"cannot list: {e}")]
    for entry in entries:
        path = entry / SKILL_FILE
        if not entry.is_dir() or not path.is_file():
            continue
        actual: SkillRoot = root if _inside(path, fence) else "outside"
        try:
            skill = parse_skill(path.read_text(encoding="utf-8"), actual, str(path))
        except (OSError, UnicodeDecodeError, SkillParseError) as e:
            issues.append(SkillIssue(str(path), actual, str(e)))
            continue
        if skill.name != entry.name:
            issues.append(SkillIssue(str(path), actual,
                                     f"name {skill.name!r} differs from its folder {entry.name!r}"))
            continue
        skills.append(skill)
    return skills, issues


def discover(home: Path, created: Mapping[str, str], version: str = "0",
             bundled: Path = BUNDLED_DIR) -> SkillSnapshot:
    """Scan every root (``created``: the Redis hash of tool-created skills, name -> text)."""
    found: list[Skill] = []
    issues: list[SkillIssue] = []
    for name, text in sorted(created.items()):
        try:
            skill = parse_skill(text, "created", f"redis:{name}")
        except SkillParseError as e:
            issues.append(SkillIssue(f"redis:{name}", "created", str(e)))
            continue
        found.append(skill)
    home_skills, plugins = skill_dirs(home)
    disk: tuple[tuple[Path, SkillRoot], ...] = ((home_skills, "home"), (bundled, "bundled"))
    for folder, root in disk:
        got, bad = _scan(folder, root, folder)
        found += got
        issues += bad
    try:
        plugin_dirs = sorted(p for p in plugins.iterdir() if p.is_dir()) if plugins.is_dir() else []
    except OSError as e:
        plugin_dirs, issues = [], [*issues, SkillIssue(str(plugins), "plugin", f"cannot list: {e}")]
    for plugin in plugin_dirs:
        got, bad = _scan(plugin / "skills", "plugin", plugin / "skills")
        found += got
        issues += bad
    skills: dict[str, Skill] = {}
    for skill in found:  # in precedence order: the first of a name wins
        if skill.name not in skills:
            skills[skill.name] = skill
        elif skill.root == skills[skill.name].root:  # e.g. two plugins ship the same name
            issues.append(SkillIssue(skill.source, skill.root,
                                     f"duplicate of {skills[skill.name].source}; ignored"))
    return SkillSnapshot(version, skills, tuple(issues))


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SkillExists(UserInputError):
    """``create`` without ``replace`` for a name the registry already has."""


class SkillRegistry:
    """One process's skill snapshot, rescanned when the fleet-wide version changes."""

    def __init__(self, r: redis.Redis, home: Path, bundled: Path = BUNDLED_DIR):
        self._r = r
        self._home = home
        self._bundled = bundled
        self._snapshot: SkillSnapshot | None = None

    @property
    def home_dir(self) -> Path:
        return skill_dirs(self._home)[0]

    def current(self, version_read: Any = None) -> SkillSnapshot:
        """The snapshot for the fleet's current version (one GET; a rescan when it moved), or
        for ``keys.skills_version()`` as the caller read it (``version_read``).
        Two greenlets may rescan at once after a bump; both results are equal."""
        raw = self._r.get(keys.skills_version()) if version_read is None else version_read
        version = _str(raw) if raw is not None else "0"
        snap = self._snapshot
        if snap is None or snap.version != version:
            snap = self._rescan(version)
        return snap

    def _rescan(self, version: str) -> SkillSnapshot:
        created = {_str(k): _str(v) for k, v in
                   self._r.hgetall(keys.skills_created()).items()}
        snap = discover(self._home, created, version, self._bundled)
        for issue in snap.issues:
            log.warning("skill %s (%s) not loaded: %s", issue.source, issue.root, issue.error)
        log.info("skill registry version %s: %d skills, %d issues", version, len(snap.skills),
                 len(snap.issues))
        self._snapshot = snap
        return snap

    def reload(self) -> SkillSnapshot:
        """Bump the fleet-wide version (every process rescans at its next turn) and rescan."""
        bump(self._r)
        return self.current()

    def create(self, text: str, *, replace: bool = False) -> tuple[Skill, str | None]:
        """Store a skill for the whole fleet (Redis), write it under ``$FERMIX_HOME/skills``
        on this host, and bump the version. Returns the skill and, when the disk write failed,
        why (the skill still exists fleet-wide). Raises SkillParseError or SkillExists."""
        skill = parse_skill(text, "created", "")
        skill = with_fields(skill, source=f"redis:{skill.name}")
        if not replace and skill.name in self.current().skills:
            raise SkillExists(f"a skill named {skill.name!r} exists; pass replace to overwrite it")
        self._r.hset(keys.skills_created(), skill.name, text)
        disk_error = None
        folder = self.home_dir / skill.name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{SKILL_FILE}.{os.getpid()}.tmp"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(folder / SKILL_FILE)
        except OSError as e:
            disk_error = f"could not write {folder / SKILL_FILE}: {e}"
            log.warning("skill_create: %s (the skill is stored in Redis)", disk_error)
        bump(self._r)
        return skill, disk_error


def bump(r: redis.Redis) -> int:
    """Make every process rescan its skills at its next turn; the new version."""
    return int(r.incr(keys.skills_version()))


def skills_section(skills: list[Skill]) -> str:
    """The prompt's "available skills" section: ``name: description`` per line; ``""`` when
    there are none."""
    if not skills:
        return ""
    lines = [f"- {s.name}: {s.description}" for s in skills[:MAX_PROMPT_SKILLS]]
    return ("## Available skills\n\nRead a skill's instructions with skill_view before "
            "following it, or give it a self-contained task with skill_run (it runs as a "
            "separate worker and reports back).\n" + "\n".join(lines))
