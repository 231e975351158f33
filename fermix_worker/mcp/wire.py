"""The pipe between a worker process and its MCP host process: one JSON object per line.

The worker starts the host with its servers in the environment (``HOST_SERVERS_ENV``: a JSON
list of McpServerConfig; no secrets, only ``${NAME}`` references the host expands). Worker to
host: requests ``{"id", "op": "list", "server"}`` and ``{"id", "op": "call", "server", "tool",
"arguments"}``, any number in flight. Host to worker, one answer per request, in any order:
``{"id", "ok": ListResult | CallResult}`` or ``{"id", "error": "MCP server 'x' ..."}`` (the
error is written for the model). ``{"id", "op": "cancel", "server"}`` gives up request ``id``
(the host cancels it, and the SDK tells the server); it has no answer, nor has the request. ``generation`` changes with the server's (re)connections and
tool list changes, and with the host process: a worker whose listing is older lists again.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

HOST_SERVERS_ENV = "FERMIX_MCP_HOST_SERVERS"
# Longest line either side accepts (tool arguments or a rendered result).
MAX_LINE_BYTES = 64 * 1024 * 1024


class ListedTool(TypedDict):
    name: str
    description: str
    input_schema: dict[str, Any]
    # The server's hints (untrusted): a durable turn re-runs an interrupted call only if set.
    idempotent: bool


class ListResult(TypedDict):
    tools: list[ListedTool]
    generation: str


class CallResult(TypedDict):
    text: str
    is_error: bool
    generation: str


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
