"""An open-loop HTTP/1.1 load generator light enough not to be the bottleneck it measures.

httpx with thousands of scheduled requests spends its CPU in its own connection pool (at
500 req/s the benchmark process, not the gateway, saturated a core). This one keeps ``conns``
keep-alive sockets on raw asyncio streams; request ``k`` is due at ``start + k / rate``, and
its latency is counted from that due time, so a slow server cannot hide queueing behind the
sender (no coordinated omission). Only what the benchmark needs: POST with a
``Content-Length`` body, responses with ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for ln in lines[1:]:
        name, _, value = ln.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def open_loop(url: str, path: str, headers: dict[str, str], body: Callable[[int], bytes],
                    rate: float, total: int, conns: int = 32) -> tuple[list[float], float]:
    """Send ``total`` POSTs at ``rate``/s; returns (latency from due time per request in s,
    achieved span in s). Raises on a non-200 answer."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    lat: list[float] = []
    next_k = 0
    start = time.perf_counter() + 0.05

    async def conn() -> None:
        nonlocal next_k
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while next_k < total:
                k, next_k = next_k, next_k + 1
                due = start + k / rate
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                data = body(k)
                writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                status = await _read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{path} answered {status}")
                lat.append(time.perf_counter() - due)
        finally:
            writer.close()

    await asyncio.gather(*(conn() for _ in range(conns)))
    return lat, time.perf_counter() - start
