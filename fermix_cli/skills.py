"""``fermix skills list | reload``: the skill registry, straight from Redis (``FERMIX_REDIS_URL``)
and this host's skill roots (``FERMIX_HOME``).

``list`` shows every skill with its trust and root, then each file that could not be loaded and
why. ``reload`` bumps the fleet-wide registry version: every worker rescans by its next turn.
An unreachable Redis exits 1. On a terminal ``list`` is two tables; ``--json`` prints the
skills and the issues as JSON (``reload --json``: ``{"ok": true, "version": N}``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import redis

from fermix_cli import output


def _list(a: argparse.Namespace) -> int:
    from fermix_shared.redis.client import cli_redis
    from fermix_shared.settings import get_settings
    from fermix_shared.skills import SkillRegistry

    snap = SkillRegistry(cli_redis(), get_settings().home).current()
    skills = snap.visible("operator")
    if a.json:
        output.print_json({
            "version": snap.version,
            "skills": [{"name": s.name, "description": s.description, "trust": s.trust,
                        "root": s.root, "source": s.source} for s in skills],
            "issues": [{"source": i.source, "root": i.root, "error": i.error}
                       for i in snap.issues],
        })
        return 0
    if (console := output.terminal()) is not None:
        output.table(console, ("SKILL", "TRUST", "ROOT", "DESCRIPTION"),
                     [(s.name, s.trust, s.root, s.description) for s in skills],
                     title=f"{len(skills)} skill{'' if len(skills) == 1 else 's'}")
        if snap.issues:
            output.table(console, ("FILE", "ROOT", "ERROR"),
                         [(i.source, i.root, output.Text(i.error, style="red"))
                          for i in snap.issues], title=f"Not loaded ({len(snap.issues)})")
        return 0
    if not skills:
        print("No skills.")
    for s in skills:
        print(f"{s.name}  {s.trust}  {s.root}  {s.description}")
    if snap.issues:
        print(f"\nNot loaded ({len(snap.issues)}):")
        for i in snap.issues:
            print(f"  {i.source} ({i.root}): {i.error}")
    return 0


def _reload(a: argparse.Namespace) -> int:
    from fermix_shared import audit
    from fermix_shared.redis.client import cli_redis
    from fermix_shared.skills import bump

    r = cli_redis()
    version = bump(r)
    audit.record(r, "admin", "skill.reload", "ok", actor="cli", version=str(version))
    output.done(a, f"Skill registry version {version}: every worker rescans its skills by its "
                "next turn.", version=version)
    return 0


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(a: argparse.Namespace) -> int:
        try:
            return func(a)
        except redis.RedisError as e:
            print(f"fermix: cannot reach Redis ({e})", file=sys.stderr)
            return 1

    return run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``skills`` and its subcommands on the ``fermix`` parser."""
    skills = sub.add_parser("skills", help="the skill registry (Redis and skill roots)")
    cmds = skills.add_subparsers(dest="skills_command", required=True)
    ls = cmds.add_parser("list", help="skills with trust and root, and files not loaded")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_guarded(_list))
    rl = cmds.add_parser("reload", help="make every worker rescan its skills by its next turn")
    output.add_json_flag(rl)
    rl.set_defaults(func=_guarded(_reload))
