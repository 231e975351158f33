"""``search_files``: the lines of the workspace's text files that a regular expression matches.

No search stalls the worker's other turns (under gevent, CPU work in a greenlet blocks them
all): the matching runs in a real OS thread of gevent's pool, with the regex engine releasing
the GIL (``concurrent=True``), and stops by itself after ``SEARCH_REGEX_SECONDS``. Files too
large, binary or gone are skipped, not searched.

The bound is the caller's wall clock: the regex engine's own ``timeout`` counts the CPU time
its thread got (on a busy machine, a 2 s bound took 4 s of wall time), so the tool stops
waiting at the deadline and answers; the abandoned match ends by itself within its CPU bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import regex as regex_lib

from fermix_worker.interrupt import gevent_active
from fermix_worker.tools.base import ToolError
from fermix_worker.tools.files.common import cooperate, int_arg, is_binary, read_bytes, text_arg
from fermix_worker.tools.files.limits import (
    LINE_MAX_CHARS,
    SEARCH_DEFAULT,
    SEARCH_LINE_CHARS,
    SEARCH_MAX,
    SEARCH_MAX_FILE_BYTES,
    SEARCH_REGEX_SECONDS,
)
from fermix_worker.tools.files.listing import glob_regex, walk
from fermix_worker.tools.workspace import Workspace

T = TypeVar("T")


def _files_to_search(ws: Workspace, args: dict[str, Any]) -> Iterator[Path]:
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

    for entry, path in walk(ws, start, max_depth=None, keep=frozenset()):
        if entry.is_file(follow_symlinks=False) and wanted(path):
            yield path


def search_files(ws: Workspace, args: dict[str, Any]) -> str:
    pattern = text_arg(args, "pattern")
    limit = int_arg(args, "max_results", SEARCH_DEFAULT, 1, SEARCH_MAX)
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
    for path in _files_to_search(ws, args):
        cooperate()
        try:
            data = read_bytes(ws, path, SEARCH_MAX_FILE_BYTES)
        except ToolError:
            continue  # too large, gone, or not a regular file: not searched
        if is_binary(data):
            continue
        want = limit + 1 - len(hits)
        try:
            found = _off_the_hub(partial(_matching_lines, compiled, data, deadline, want),
                                 deadline)
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


def _off_the_hub(fn: Callable[[], T], deadline: float) -> T:
    """``fn()`` in a real OS thread (gevent's pool under gevent: this greenlet waits, the
    others run), waited for until ``deadline`` (monotonic) at most: TimeoutError then."""
    wait_s = max(0.0, deadline - time.monotonic())
    if not gevent_active():
        try:
            return _THREADS.submit(fn).result(timeout=wait_s)
        except FutureTimeout:
            raise TimeoutError from None
    from gevent import Timeout, get_hub

    try:
        return get_hub().threadpool.spawn(fn).get(timeout=wait_s)  # type: ignore[no-any-return]
    except Timeout:
        raise TimeoutError from None


# The searches of a process not under gevent (the threads pool, tests): an abandoned match
# holds its thread until its own CPU bound ends it.
_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fermix-search")
