"""The file tools, confined to the turn's workspace (:mod:`fermix_worker.tools.workspace`).

``read_file``, ``list_files`` and ``search_files`` are ``read_only`` (guests get them);
``write_file`` and ``edit_file`` are ``read_write``. Every result is bounded: a read returns a
window of lines (``offset``/``limit``) under a character cap, a listing and a search stop at a
count and say so, a write or an edit never makes a file larger than ``WRITE_MAX_BYTES`` (an
edit's result size is computed from its count of matches before anything is replaced).

No call stalls the worker's other turns (under gevent, CPU work in a greenlet blocks them all):
a search's matching runs in a real OS thread of gevent's pool, with the regex engine releasing
the GIL (``concurrent=True``), and stops by itself after ``SEARCH_REGEX_SECONDS``. Recursive walks never follow a symlinked directory and skip the usual bulk
(``.git``, ``node_modules``, ...) unless the pattern names it.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import regex as regex_lib

from fermix_shared.settings import Settings
from fermix_worker.interrupt import gevent_active
from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.workspace import Workspace, os_error, turn_workspace, workspace_configured

READ_DEFAULT_LINES = 1000
READ_MAX_LINES = 5000
READ_MAX_CHARS = 16_000
LINE_MAX_CHARS = 2000
# Larger files are refused by read_file and edit_file, and skipped by search_files.
READ_MAX_FILE_BYTES = 64 * 1024 * 1024
EDIT_MAX_FILE_BYTES = 8 * 1024 * 1024
SEARCH_MAX_FILE_BYTES = 4 * 1024 * 1024
WRITE_MAX_BYTES = 8 * 1024 * 1024
LIST_DEFAULT, LIST_MAX = 200, 1000
SEARCH_DEFAULT, SEARCH_MAX = 100, 500
# Seconds one search may spend matching, over all its lines.
SEARCH_REGEX_SECONDS = 2.0
SEARCH_LINE_CHARS = 300
# A file with a NUL byte in its first block is binary: not read, not searched.
SNIFF_BYTES = 8192
T = TypeVar("T")
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv",
                       ".mypy_cache", ".pytest_cache", ".ruff_cache"})


def _text(args: dict[str, Any], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str) or (default is None and not value):
        raise ToolError(f"{name} must be a non-empty string")
    return value


def _int(args: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ToolError(f"{name} must be a whole number")
    if not low <= value <= high:
        raise ToolError(f"{name} must be between {low} and {high}")
    return int(value)


def _cooperate() -> None:
    """Let other turns run between files (under gevent, ``sleep(0)`` yields to the hub)."""
    time.sleep(0)


def _is_binary(head: bytes) -> bool:
    return b"\0" in head[:SNIFF_BYTES]


def _read_bytes(ws: Workspace, path: Path, cap: int) -> bytes:
    """A whole regular file of at most ``cap`` bytes."""
    with os.fdopen(ws.open(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise ToolError(f"{ws.rel(path)} is too large ({size:,} bytes; the limit is {cap:,})")
        return f.read(cap + 1)


# -- read, write, edit -----------------------------------------------------------------------

def _read(ws: Workspace, args: dict[str, Any]) -> str:
    path = ws.resolve(args.get("path"))
    offset = _int(args, "offset", 1, 1, 10**9)
    limit = _int(args, "limit", READ_DEFAULT_LINES, 1, READ_MAX_LINES)
    name = ws.rel(path)
    with os.fdopen(ws.open(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > READ_MAX_FILE_BYTES:
            raise ToolError(f"{name} is too large to read here ({size:,} bytes)")
        if _is_binary(f.read(SNIFF_BYTES)):
            raise ToolError(f"{name} is a binary file ({size:,} bytes)")
        f.seek(0)
        lines: list[str] = []
        chars, number, last = 0, 0, 0
        for number, raw in enumerate(f, start=1):
            if number < offset:
                continue
            line = raw.decode("utf-8", errors="replace")
            if len(line) > LINE_MAX_CHARS:
                line = line[:LINE_MAX_CHARS] + " [line truncated]\n"
            if len(lines) == limit or (lines and chars + len(line) > READ_MAX_CHARS):
                return "".join(lines) + (
                    f"\n[lines {offset}-{last} of {name}; more follow: read on with "
                    f"offset={last + 1}]")
            lines.append(line)
            chars += len(line)
            last = number
    if not lines:
        return "(empty file)" if number == 0 else (
            f"[{name} has {number} lines; offset {offset} is past the end]")
    return "".join(lines)


def _write(ws: Workspace, args: dict[str, Any]) -> str:
    path = ws.resolve(args.get("path"))
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string (the whole new file)")
    data = content.encode()
    if len(data) > WRITE_MAX_BYTES:
        raise ToolError(f"content is too large ({len(data):,} bytes; the limit is "
                        f"{WRITE_MAX_BYTES:,})")
    existed = path.exists()
    fd = ws.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    verb = "replaced" if existed else "created"
    return f"{verb} {ws.rel(path)} ({len(data):,} bytes)"


def _edit(ws: Workspace, args: dict[str, Any]) -> str:
    path = ws.resolve(args.get("path"))
    old = _text(args, "old_string")
    new = args.get("new_string")
    if not isinstance(new, str):
        raise ToolError("new_string must be a string")
    if old == new:
        raise ToolError("old_string and new_string are the same; nothing to change")
    name = ws.rel(path)
    data = _read_bytes(ws, path, EDIT_MAX_FILE_BYTES)
    if _is_binary(data):
        raise ToolError(f"{name} is a binary file")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ToolError(f"{name} is not UTF-8 text; edit_file would corrupt it") from None
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old_string was not found in {name}; it must match exactly, "
                        "whitespace and indentation included (read the file again)")
    if count > 1 and not args.get("replace_all"):
        raise ToolError(f"old_string occurs {count} times in {name}; include more of the "
                        "surrounding text so it occurs once, or set replace_all")
    # The result's size before it is built: a small file times many matches can be huge.
    size = len(data) + count * (len(new.encode()) - len(old.encode()))
    if size > WRITE_MAX_BYTES:
        raise ToolError(f"the edit would make {name} {size:,} bytes ({count:,} occurrences "
                        f"replaced); the limit is {WRITE_MAX_BYTES:,} bytes. Nothing was "
                        "changed")
    fd = ws.open(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "wb") as f:
        f.write(text.replace(old, new).encode())
    return f"replaced {count} occurrence{'s' if count > 1 else ''} in {name}"


# -- list and search -------------------------------------------------------------------------

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


def _walk(ws: Workspace, base: Path, *, max_depth: int | None, keep: frozenset[str]
          ) -> Iterator[tuple[os.DirEntry[str], Path]]:
    """Every entry below ``base`` (breadth first, sorted per directory), with its path. Does not
    descend into symlinked directories or ``SKIP_DIRS`` (unless named in ``keep``); yields no
    symlink that points outside the root."""
    queue = deque([(base, 1)])
    while queue:
        folder, depth = queue.popleft()
        _cooperate()
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


def _list(ws: Workspace, args: dict[str, Any]) -> str:
    pattern = _text(args, "pattern", "*") or "*"
    limit = _int(args, "max_entries", LIST_DEFAULT, 1, LIST_MAX)
    base, rest = _split_pattern(ws, pattern)
    if not base.is_dir():
        raise ToolError(f"{ws.rel(base)} is not a directory")
    regex = glob_regex(rest)
    depth = None if "**" in rest else rest.count("/") + 1
    keep = frozenset(rest.split("/"))
    lines: list[str] = []
    for entry, path in _walk(ws, base, max_depth=depth, keep=keep):
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


def _search_files(ws: Workspace, args: dict[str, Any]) -> Iterator[Path]:
    """The files a search looks at: ``path`` itself, or the regular files below it whose path
    (from the root; from their folder when ``glob`` has no ``/``) matches ``glob``."""
    start = ws.resolve(args.get("path") or ".")
    if not start.is_dir():
        yield start
        return
    glob = args.get("glob")
    if glob is not None and not isinstance(glob, str):
        raise ToolError("glob must be a string such as '*.py' or 'src/**/*.ts'")
    regex = glob_regex(glob) if glob else None

    def wanted(path: Path) -> bool:
        if regex is None:
            return True
        return bool(regex.fullmatch(path.name if "/" not in str(glob) else ws.rel(path)))

    for entry, path in _walk(ws, start, max_depth=None, keep=frozenset()):
        if entry.is_file(follow_symlinks=False) and wanted(path):
            yield path


def _search(ws: Workspace, args: dict[str, Any]) -> str:
    pattern = _text(args, "pattern")
    limit = _int(args, "max_results", SEARCH_DEFAULT, 1, SEARCH_MAX)
    flags = regex_lib.IGNORECASE if args.get("ignore_case") else 0
    try:
        compiled = regex_lib.compile(
            regex_lib.escape(pattern) if args.get("fixed_strings") else pattern, flags)
    except regex_lib.error as e:
        raise ToolError(f"invalid regular expression: {e} (set fixed_strings for plain text)"
                        ) from None
    # The whole search's matching is time-bounded: a pathological pattern ("(a|a)*b") is CPU
    # that no greenlet switch can interrupt, so it must stop by itself; and it runs off the
    # hub, so the worker's other turns go on meanwhile.
    deadline = time.monotonic() + SEARCH_REGEX_SECONDS
    hits: list[str] = []
    for path in _search_files(ws, args):
        _cooperate()
        try:
            data = _read_bytes(ws, path, SEARCH_MAX_FILE_BYTES)
        except ToolError:
            continue  # too large, gone, or not a regular file: not searched
        if _is_binary(data):
            continue
        want = limit + 1 - len(hits)
        try:
            found = _off_the_hub(partial(_matching_lines, compiled, data, deadline, want))
        except TimeoutError:
            raise ToolError(
                f"the pattern took longer than {SEARCH_REGEX_SECONDS:g} s to match; "
                "simplify it or set fixed_strings") from None
        for number, line in found:
            if len(hits) == limit:
                hits.append(f"[stopped at {limit} matches; narrow the search]")
                return "\n".join(hits)
            hits.append(f"{ws.rel(path)}:{number}: {line[:SEARCH_LINE_CHARS]}")
    return "\n".join(hits) if hits else f"no matches for {pattern!r}"


def _matching_lines(compiled: regex_lib.Pattern[str], data: bytes, deadline: float,
                    want: int) -> list[tuple[int, str]]:
    """Up to ``want`` lines of ``data`` that ``compiled`` matches (TimeoutError past
    ``deadline``). Pure CPU: runs off the hub, releasing the GIL while it matches."""
    out: list[tuple[int, str]] = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        # Only the head of a very long line (minified code) is searched and shown.
        if compiled.search(line[:LINE_MAX_CHARS], concurrent=True,
                           timeout=max(0.001, deadline - time.monotonic())):
            out.append((number, line))
            if len(out) == want:
                break
    return out


def _off_the_hub(fn: Callable[[], T]) -> T:
    """``fn()`` in a real OS thread of gevent's pool under gevent (this greenlet waits, the
    others run), else here (the threads pool is already an OS thread)."""
    if not gevent_active():
        return fn()
    from gevent import get_hub

    return get_hub().threadpool.apply(fn)  # type: ignore[no-any-return]


# -- the tools -------------------------------------------------------------------------------

_PATH = {"type": "string", "description": "path relative to the workspace root"}


def file_tools(settings: Settings) -> list[Tool]:
    """The file tools over the calling turn's workspace; none when no workspace is configured."""
    if not workspace_configured(settings):
        return []

    def bound(fn: Callable[[Workspace, dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
        def run(args: dict[str, Any]) -> str:
            ws = turn_workspace(settings)
            try:
                return fn(ws, args)
            except OSError as e:  # a race with another writer: the model reads why
                raise os_error(e, str(args.get("path") or "the workspace")) from e
        return run

    return [
        Tool(
            name="read_file",
            description=(
                f"Read a text file from the workspace: up to {READ_DEFAULT_LINES} lines from "
                "line `offset` (1-based), or `limit` lines. Long files: read on from the "
                "offset the result names."),
            parameters={"type": "object", "properties": {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": READ_MAX_LINES},
            }, "required": ["path"]},
            run=bound(_read),
        ),
        Tool(
            name="write_file",
            description=("Create or overwrite a file in the workspace with `content` (the whole "
                         "file); missing parent folders are created."),
            parameters={"type": "object", "properties": {
                "path": _PATH, "content": {"type": "string"},
            }, "required": ["path", "content"]},
            run=bound(_write), policy="read_write", idempotent=True,
        ),
        Tool(
            name="edit_file",
            description=(
                "Replace `old_string` with `new_string` in a workspace file. `old_string` must "
                "match exactly (whitespace included) and occur once, unless `replace_all`."),
            parameters={"type": "object", "properties": {
                "path": _PATH,
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean", "default": False},
            }, "required": ["path", "old_string", "new_string"]},
            run=bound(_edit), policy="read_write", idempotent=False,
        ),
        Tool(
            name="list_files",
            description=(
                "List workspace files matching a glob relative to the root: '*' (default), "
                "'src/*', '**/*.py'. A folder's name lists the folder. Folders end in '/'."),
            parameters={"type": "object", "properties": {
                "pattern": {"type": "string"},
                "max_entries": {"type": "integer", "minimum": 1, "maximum": LIST_MAX},
            }},
            run=bound(_list),
        ),
        Tool(
            name="search_files",
            description=(
                "Search workspace text files for a regular expression (Python syntax), or for "
                "plain text with `fixed_strings`. Returns path:line: text. `path`: a file or "
                "folder to search (default: all); `glob`: which files, e.g. '*.py'."),
            parameters={"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": _PATH,
                "glob": {"type": "string"},
                "fixed_strings": {"type": "boolean", "default": False},
                "ignore_case": {"type": "boolean", "default": False},
                "max_results": {"type": "integer", "minimum": 1, "maximum": SEARCH_MAX},
            }, "required": ["pattern"]},
            run=bound(_search),
        ),
    ]
