"""The console's conversations list with 10,000 conversations: how long a page takes.

A private redis-server holds 10,000 conversations accepted through the real accept path
(``queue.accept``: 10,000 queued messages), of which 200 are marked running; a real uvicorn
gateway serves ``GET /v1/conversations`` (the first page, a search, a state filter, a page deep
in the list) and the HTML page ``/console/conversations``. Reported per request (sequential,
one client, after a warm-up): median and min-max over ``--requests``.

Run: ``.venv/bin/python benchmarks/console_conversations.py [--conversations 10000]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import redis
import uvicorn

from fermix_dev.procs import free_port, start_redis, wait_until
from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_shared.stores import queue

TOKEN = "bench-t0k"


def seed(r: redis.Redis, n: int) -> None:
    for i in range(n):
        key = ConversationKey(channel="telegram" if i % 3 else "http", chat_id=f"c{i:05d}")
        queue.accept(r, InboundMessage(key=key, text=f"message {i}", sender_id="7",
                                       agent="ops" if i % 7 == 0 else "default"))
    now = int(time.time() * 1000)
    for i in range(0, n, n // 200):
        r.zadd(keys.active_index(), {f"telegram|c{i:05d}|root": now + 30_000})


def timed(client: httpx.Client, path: str, params: dict[str, str], requests: int) -> list[float]:
    out = []
    for _ in range(requests):
        t = time.perf_counter()
        resp = client.get(path, params=params)
        out.append((time.perf_counter() - t) * 1000)
        assert resp.status_code == 200, resp.text
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=30)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            r = redis.Redis.from_url(url, decode_responses=True)
            t = time.perf_counter()
            seed(r, a.conversations)
            print(f"seeded {a.conversations} conversations in {time.perf_counter() - t:.1f} s")
            app = create_app(Settings(redis_url=url, api_token=TOKEN), hooks=HookRegistry())
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                   log_level="warning"))
            threading.Thread(target=server.run, daemon=True).start()
            wait_until(lambda: server.started, 20, "gateway")
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=30) as client:
                client.post("/console/login", data={"token": TOKEN})  # the session cookie
                cases = [("first page", "/v1/conversations", {}),
                         ("search 'c0999'", "/v1/conversations", {"q": "c0999"}),
                         ("state=running", "/v1/conversations", {"state": "running"}),
                         ("offset 9,000", "/v1/conversations", {"offset": "9000"}),
                         ("console page", "/console/conversations", {}),
                         ("console search", "/console/conversations", {"q": "ops"})]
                print("| request | median ms | min-max ms |\n| --- | --- | --- |")
                for name, path, params in cases:
                    timed(client, path, params, 3)
                    ms = timed(client, path, params, a.requests)
                    print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f}-{max(ms):.1f} |")
            server.should_exit = True
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
