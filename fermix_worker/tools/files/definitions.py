"""The five file tools as the model sees them (names, descriptions, JSON schemas, policy
classes), bound to the calling turn's workspace by :func:`file_tools` (in a subagent: its
parent turn's, read-only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fermix_shared.settings import Settings
from fermix_worker.tools.base import Tool
from fermix_worker.tools.context import RunContext
from fermix_worker.tools.files.limits import (
    LIST_MAX,
    READ_DEFAULT_LINES,
    READ_MAX_LINES,
    SEARCH_MAX,
)
from fermix_worker.tools.files.listing import list_files
from fermix_worker.tools.files.read_write import edit_file, read_file, write_file
from fermix_worker.tools.files.search import search_files
from fermix_worker.tools.workspace import Workspace, os_error, run_workspace, workspace_configured

_PATH = {"type": "string", "description": "path relative to the workspace root"}

_READ_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {
    "path": _PATH,
    "offset": {"type": "integer", "minimum": 1},
    "limit": {"type": "integer", "minimum": 1, "maximum": READ_MAX_LINES},
}, "required": ["path"]}

_WRITE_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {
    "path": _PATH, "content": {"type": "string"},
}, "required": ["path", "content"]}

_EDIT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {
    "path": _PATH,
    "old_string": {"type": "string"},
    "new_string": {"type": "string"},
    "replace_all": {"type": "boolean", "default": False},
}, "required": ["path", "old_string", "new_string"]}

_LIST_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {
    "pattern": {"type": "string"},
    "max_entries": {"type": "integer", "minimum": 1, "maximum": LIST_MAX},
}}

_SEARCH_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {
    "pattern": {"type": "string"},
    "path": _PATH,
    "glob": {"type": "string"},
    "fixed_strings": {"type": "boolean", "default": False},
    "ignore_case": {"type": "boolean", "default": False},
    "max_results": {"type": "integer", "minimum": 1, "maximum": SEARCH_MAX},
}, "required": ["pattern"]}


def file_tools(settings: Settings) -> list[Tool]:
    """The file tools over the calling turn's workspace; none when no workspace is configured."""
    if not workspace_configured(settings):
        return []

    def bound(fn: Callable[[Workspace, dict[str, Any]], str]
              ) -> Callable[[RunContext, dict[str, Any]], str]:
        def run(ctx: RunContext, args: dict[str, Any]) -> str:
            ws = run_workspace(settings, ctx)
            try:
                return fn(ws, args)
            except OSError as e:  # a race with another writer: the model reads why
                raise os_error(e, str(args.get("path") or "the workspace")) from e
        return run

    return [
        Tool(name="read_file", description=(
            f"Read a text file from the workspace: up to {READ_DEFAULT_LINES} lines from "
            "line `offset` (1-based), or `limit` lines. Long files: read on from the "
            "offset the result names."),
            parameters=_READ_PARAMETERS, run=bound(read_file)),
        Tool(name="write_file", description=(
            "Create or overwrite a file in the workspace with `content` (the whole "
            "file); missing parent folders are created."),
            parameters=_WRITE_PARAMETERS, run=bound(write_file), policy="read_write",
            idempotent=True),
        Tool(name="edit_file", description=(
            "Replace `old_string` with `new_string` in a workspace file. `old_string` must "
            "match exactly (whitespace included) and occur once, unless `replace_all`."),
            parameters=_EDIT_PARAMETERS, run=bound(edit_file), policy="read_write",
            idempotent=False),
        Tool(name="list_files", description=(
            "List workspace files matching a glob relative to the root: '*' (default), "
            "'src/*', '**/*.py'. A folder's name lists the folder. Folders end in '/'."),
            parameters=_LIST_PARAMETERS, run=bound(list_files)),
        Tool(name="search_files", description=(
            "Search workspace text files for a regular expression (Python syntax), or for "
            "plain text with `fixed_strings`. Returns path:line: text. `path`: a file or "
            "folder to search (default: all); `glob`: which files, e.g. '*.py'."),
            parameters=_SEARCH_PARAMETERS, run=bound(search_files)),
    ]
