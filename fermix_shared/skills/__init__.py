"""Skills: ``SKILL.md`` files found in known roots, each with the trust of its root.

Parsing is :mod:`.parse`; discovery, the per-process snapshot and the fleet-wide version that
makes every worker rescan are :mod:`.registry`. The gateway and the worker both use them; the
skill tools live in ``fermix_worker.tools.skills``.
"""

from fermix_shared.skills.parse import (
    ROOT_TRUST,
    Skill,
    SkillParseError,
    SkillRoot,
    parse_skill,
    render_skill,
)
from fermix_shared.skills.registry import (
    BUNDLED_DIR,
    SkillExists,
    SkillIssue,
    SkillRegistry,
    SkillSnapshot,
    bump,
    discover,
    skills_section,
)

__all__ = [
    "BUNDLED_DIR",
    "ROOT_TRUST",
    "Skill",
    "SkillExists",
    "SkillIssue",
    "SkillParseError",
    "SkillRegistry",
    "SkillRoot",
    "SkillSnapshot",
    "bump",
    "discover",
    "parse_skill",
    "render_skill",
    "skills_section",
]
