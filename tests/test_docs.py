"""The documentation: a short README that keeps the Quickstart, and an MkDocs site under
``docs/`` that builds with ``--strict``.

Under ``--strict`` every warning fails the build, and ``mkdocs.yml``'s ``validation`` makes a
warning of each way the site rots silently: a link to a page or an anchor that moved, an
absolute link, a page left out of the nav. The build runs ``mkdocs build --strict`` through
MkDocs' own command line, in this process: the same command and exit code as
``python -m mkdocs build --strict``, without starting a process (which would make this a
``fleet`` test, see ``tests/fleet_marks.py``) and in about a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from mkdocs.__main__ import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_BYTES = 8192
QUICKSTART = ["bash scripts/dev.sh", "bash scripts/test.sh"]


def nav_pages(entries: Any) -> list[str]:
    """Every page path in an ``nav`` tree (``- Title: page.md``, ``- page.md``, sections)."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    raise AssertionError(f"unexpected nav entry: {entries!r}")


@pytest.mark.timeout(60)
def test_the_site_builds_strict(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [
        "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
        "--site-dir", str(tmp_path / "site"),
    ])
    assert result.exit_code == 0, f"mkdocs build --strict failed:\n{result.output}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_page_under_docs_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    in_nav = nav_pages(config["nav"])
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(in_nav)) == on_disk
    assert len(in_nav) == len(set(in_nav)), "a page is in the nav twice"


def quickstart_commands(readme: str) -> list[str]:
    """The commands of the first ``sh`` block under ``## Quickstart``, comments cut off."""
    section = readme.split("\n## Quickstart\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_is_short_and_keeps_the_quickstart() -> None:
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= README_MAX_BYTES, (
        f"README.md is {len(readme)} bytes (at most {README_MAX_BYTES}): move the detail to docs/"
    )
    assert quickstart_commands(readme.decode("utf-8")) == QUICKSTART
    # CI runs the README's test command, as the README says (its own line: not behind an `if`).
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "bash scripts/test.sh" in ci


def test_the_skill_example_names_a_real_tool_its_policy_allows() -> None:
    from fermix_shared.skills.parse import parse_skill
    from fermix_worker.tools import BUILTIN_TOOLS

    page = (DOCS / "features" / "skills.md").read_text(encoding="utf-8")
    example = page.split("```markdown\n", 1)[1].split("```", 1)[0]
    skill = parse_skill(example, "home", "docs/features/skills.md")
    tools = {t.name: t for t in BUILTIN_TOOLS}
    assert skill.allowed_tools and set(skill.allowed_tools) <= set(tools), skill.allowed_tools
    assert skill.policy is not None
    assert all(tools[name].policy in skill.policy for name in skill.allowed_tools)
