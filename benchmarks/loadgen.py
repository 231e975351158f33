"""An open-loop HTTP/1.1 load generator light enough not to be the bottleneck it measures.

httpx with thousands of scheduled requests spends its CPU in its own connection pool (at
500 req/s the benchmark process, not the gateway, saturated a core). This one keeps ``conns``
keep-alive sockets on raw asyncio streams; request ``k`` is due at ``start + k / rate``, and
its latency is counted from that due time, so a slow server cannot hide queueing behind the
sender (no coordinated omission). Only what the benchmark needs: POST with a
``Content-Length`` body, responses with ``Content-Length``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
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


async def closed_loop(url: str, path: str, headers: dict[str, str], body: Callable[[int], bytes],
                      senders: int, stop: asyncio.Event,
                      ready: Callable[[], None] | None = None,
                      rate: float | None = None) -> list[tuple[float, float]]:
    """``senders`` keep-alive connections, each sending its next POST as soon as the last one
    is answered, until ``stop`` is set; returns (sent at, latency) per request in s, the send
    time as Unix time (to line up with other processes' clocks). ``ready`` is called once
    every connection had an answer. With ``rate``, request ``k`` is due at ``k / rate`` s after
    the start instead (open loop over the same connections), and its latency counts from then
    (a slow answer cannot hide the queueing behind it)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    out: list[tuple[float, float]] = []
    counter = iter(range(10**12))
    warmed: set[int] = set()
    offset = time.time() - time.perf_counter()
    start = time.perf_counter()

    async def conn(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not stop.is_set():
                k = next(counter)
                data = body(k)
                sent = time.perf_counter()
                if rate is not None:
                    due = start + k / rate
                    if due > sent:
                        await asyncio.sleep(due - sent)
                    sent = due
                writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                status = await _read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{path} answered {status}")
                out.append((offset + sent, time.perf_counter() - sent))
                if i not in warmed:
                    warmed.add(i)
                    if len(warmed) == senders and ready is not None:
                        ready()
        finally:
            writer.close()

    await asyncio.gather(*(conn(i) for i in range(senders)))
    return out


def _telegram_update(update_id: int, sender: int) -> bytes:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": 1441645532, "text": f"hello {update_id}",
        "from": {"id": sender, "is_bot": False, "first_name": "Stranger"},
        "chat": {"id": sender, "type": "private"}}}).encode()


def main() -> int:
    """``loadgen.py telegram-senders URL SECRET N``: N closed-loop senders of stranger Telegram
    updates in a process of their own (so the load the benchmark makes elsewhere cannot stall
    the measurement), until SIGTERM. Prints ``ready`` once every sender had an answer, then on
    exit one JSON line: ``[[sent_at_s, latency_s], ...]``."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("mode", choices=["telegram-senders"])
    p.add_argument("url")
    p.add_argument("secret")
    p.add_argument("senders", type=int)
    p.add_argument("--first-update-id", type=int, default=int(time.time() * 1000))
    p.add_argument("--rate", type=float, default=None,
                   help="open loop at this many requests/s in all (default: closed loop)")
    args = p.parse_args()

    async def run() -> list[tuple[float, float]]:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        headers = {"X-Telegram-Bot-Api-Secret-Token": args.secret,
                   "Content-Type": "application/json"}
        return await closed_loop(
            args.url, "/webhooks/telegram", headers,
            lambda k: _telegram_update(args.first_update_id + k, 7_000_000 + k % args.senders),
            args.senders, stop, ready=lambda: print("ready", flush=True), rate=args.rate)

    print(json.dumps(asyncio.run(run())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
