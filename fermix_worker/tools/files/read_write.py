"""``read_file``, ``write_file`` and ``edit_file``: a window of a text file's lines, a whole new
file, an exact replacement in place.

Every result is bounded (:mod:`~fermix_worker.tools.files.limits`): a read stops at a count of
lines or characters and names the offset to read on from; an edit's result size is computed
from its count of matches before anything is replaced.
"""

from __future__ import annotations

import os
from typing import Any

from fermix_worker.tools.base import ToolError
from fermix_worker.tools.files.common import int_arg, is_binary, read_bytes, text_arg
from fermix_worker.tools.files.limits import (
    EDIT_MAX_FILE_BYTES,
    LINE_MAX_CHARS,
    READ_DEFAULT_LINES,
    READ_MAX_CHARS,
    READ_MAX_FILE_BYTES,
    READ_MAX_LINES,
    SNIFF_BYTES,
    WRITE_MAX_BYTES,
)
from fermix_worker.tools.workspace import Workspace


def read_file(ws: Workspace, args: dict[str, Any]) -> str:
    path = ws.resolve(args.get("path"))
    offset = int_arg(args, "offset", 1, 1, 10**9)
    limit = int_arg(args, "limit", READ_DEFAULT_LINES, 1, READ_MAX_LINES)
    name = ws.rel(path)
    with os.fdopen(ws.open(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > READ_MAX_FILE_BYTES:
            raise ToolError(f"{name} is too large to read here ({size:,} bytes)")
        if is_binary(f.read(SNIFF_BYTES)):
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


def write_file(ws: Workspace, args: dict[str, Any]) -> str:
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


def edit_file(ws: Workspace, args: dict[str, Any]) -> str:
    path = ws.resolve(args.get("path"))
    old = text_arg(args, "old_string")
    new = args.get("new_string")
    if not isinstance(new, str):
        raise ToolError("new_string must be a string")
    if old == new:
        raise ToolError("old_string and new_string are the same; nothing to change")
    name = ws.rel(path)
    data = read_bytes(ws, path, EDIT_MAX_FILE_BYTES)
    if is_binary(data):
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
