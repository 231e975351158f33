"""MCP servers as tools: ``[[mcp_servers]]`` (fermix_shared/mcp_config.py) reached through the
official ``mcp`` SDK.

    worker process (gevent greenlets, or threads)        MCP host process (asyncio)
    tools.py   McpTools: listings, Tool objects   --->   host.py      requests, many at once
    bridge.py  McpHost: pipe, replies, restarts   <---   sessions.py  one session per server
                     JSON lines (wire.py)                content.py   results as text

The SDK is asyncio; the worker runs under gevent's monkey-patching, where asyncio cannot start
a stdio server from a thread. So each worker process has a host *process* that owns every
session, and the worker talks to it over a pipe with ordinary (patched) blocking I/O.

Nothing is imported here: the host process imports this package and must stay light.
"""
