"""The reference MCP "everything" server (``@modelcontextprotocol/server-everything``, written by
the MCP project, not by us), installed from the npm registry into ``.cache/mcp/`` (gitignored)
the first time a test needs it, and run with node over stdio.

Without Node.js and npm on PATH the tests that need it skip, saying so; with them, a failed
install fails those tests (they never skip then).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fermix_shared.mcp_config import McpServerConfig

PACKAGE = "@modelcontextprotocol/server-everything"
# Pinned: its tool names and answers are what the tests check.
VERSION = "2026.8.31"
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "mcp"
INSTALL_TIMEOUT_S = 300


def everything_js() -> Path:
    """The server's entry point, installed first if the cache does not hold this version."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not on PATH: the MCP tests run the reference "
                    f"server ({PACKAGE}) with Node.js; install nodejs and npm to run them")
    npm = shutil.which("npm") or "npm"
    target = CACHE / f"server-everything-{VERSION}"
    entry = target / "node_modules" / PACKAGE / "dist" / "index.js"
    if entry.is_file():
        return entry
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:  # one installer at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if entry.is_file():
            return entry
        staging = Path(tempfile.mkdtemp(prefix="install-", dir=CACHE))
        try:
            done = subprocess.run(
                [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                 "--loglevel", "error", f"{PACKAGE}@{VERSION}"],
                capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
            )
            if done.returncode != 0:
                raise RuntimeError(f"npm install {PACKAGE}@{VERSION} failed "
                                   f"({done.returncode}):\n{done.stderr[-2000:]}")
            staging.rename(target)  # whole or not at all
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def everything_server(name: str = "everything", **fields: object) -> McpServerConfig:
    return McpServerConfig.model_validate({
        "name": name, "command": "node", "args": [str(everything_js()), "stdio"], **fields})
