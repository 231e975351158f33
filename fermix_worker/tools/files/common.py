"""What the file tools share: checking the model's arguments, telling a binary file, reading a
whole bounded file, and letting the worker's other turns run between files."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from fermix_worker.tools.base import ToolError
from fermix_worker.tools.files.limits import SNIFF_BYTES
from fermix_worker.tools.workspace import Workspace


def text_arg(args: dict[str, Any], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str) or (default is None and not value):
        raise ToolError(f"{name} must be a non-empty string")
    return value


def int_arg(args: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ToolError(f"{name} must be a whole number")
    if not low <= value <= high:
        raise ToolError(f"{name} must be between {low} and {high}")
    return int(value)


def cooperate() -> None:
    """Let other turns run between files (under gevent, ``sleep(0)`` yields to the hub)."""
    time.sleep(0)


def is_binary(head: bytes) -> bool:
    return b"\0" in head[:SNIFF_BYTES]


def read_bytes(ws: Workspace, path: Path, cap: int) -> bytes:
    """A whole regular file of at most ``cap`` bytes."""
    with os.fdopen(ws.open(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise ToolError(f"{ws.rel(path)} is too large ({size:,} bytes; the limit is {cap:,})")
        return f.read(cap + 1)
