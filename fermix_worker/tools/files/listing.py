"""``list_files``, and the walk and glob matching that ``search_files`` shares with it.

A glob is relative to the workspace root and confined to it (no ``..``; an absolute pattern
must lie inside). Recursive walks never follow a symlinked directory and skip the usual bulk
(:data:`SKIP_DIRS`) unless the pattern names it.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fermix_worker.tools.base import ToolError
from fermix_worker.tools.files.common import cooperate, int_arg, text_arg
from fermix_worker.tools.files.limits import LIST_DEFAULT, LIST_MAX
from fermix_worker.tools.workspace import Workspace

SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv",
                       ".mypy_cache", ".pytest_cache", ".ruff_cache"})


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex over ``/``-separated relative paths: ``*`` and ``?`` stay within one
    name, ``**`` spans directories, ``[...]`` is a character class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _has_magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def walk(ws: Workspace, base: Path, *, max_depth: int | None, keep: frozenset[str]
         ) -> Iterator[tuple[os.DirEntry[str], Path]]:
    """Every entry below ``base`` (breadth first, sorted per directory), with its path. Does not
    descend into symlinked directories or ``SKIP_DIRS`` (unless named in ``keep``); yields no
    symlink that points outside the root."""
    queue = deque([(base, 1)])
    while queue:
        folder, depth = queue.popleft()
        cooperate()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # vanished or unreadable: list what can be listed
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                real = Path(os.path.realpath(path))
                if real != ws.root and not real.is_relative_to(ws.root):
                    continue
            elif (entry.is_dir(follow_symlinks=False)
                    and (entry.name not in SKIP_DIRS or entry.name in keep)
                    and (max_depth is None or depth < max_depth)):
                queue.append((path, depth + 1))
            yield entry, path


def _split_pattern(ws: Workspace, pattern: str) -> tuple[Path, str]:
    """The directory a glob starts from (its literal leading part, confined) and the rest."""
    if Path(pattern).is_absolute():
        try:
            pattern = Path(pattern).relative_to(ws.root).as_posix()
        except ValueError:
            raise ToolError(f"{pattern!r} is outside the workspace; patterns are relative to "
                            "its root") from None
    parts = [p for p in Path(pattern).parts if p not in ("", ".")]
    if ".." in parts:
        raise ToolError("patterns cannot leave the workspace (no '..')")
    literal: list[str] = []
    for part in parts:
        if _has_magic(part):
            break
        literal.append(part)
    rest = "/".join(parts[len(literal):])
    base = ws.resolve("/".join(literal) or ".")
    if not rest:
        if base.is_dir():
            return base, "*"
        return base.parent, base.name
    return base, rest


def list_files(ws: Workspace, args: dict[str, Any]) -> str:
    pattern = text_arg(args, "pattern", "*") or "*"
    limit = int_arg(args, "max_entries", LIST_DEFAULT, 1, LIST_MAX)
    base, rest = _split_pattern(ws, pattern)
    if not base.is_dir():
        raise ToolError(f"{ws.rel(base)} is not a directory")
    regex = glob_regex(rest)
    depth = None if "**" in rest else rest.count("/") + 1
    keep = frozenset(rest.split("/"))
    lines: list[str] = []
    for entry, path in walk(ws, base, max_depth=depth, keep=keep):
        if not regex.fullmatch(path.relative_to(base).as_posix()):
            continue
        if len(lines) == limit:
            lines.append(f"[more than {limit} entries; narrow the pattern]")
            break
        name = ws.rel(path)
        try:
            if entry.is_dir():
                lines.append(name + "/")
            else:
                lines.append(f"{name} ({entry.stat().st_size:,} bytes)")
        except OSError:
            lines.append(name)
    return "\n".join(lines) if lines else f"no files match {pattern!r}"
