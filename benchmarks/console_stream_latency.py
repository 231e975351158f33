"""The console's live reply: how long from a streamed delta to the browser showing it.

A real stack (redis-server, gateway, one worker, the scripted model streaming 40 words at one
every 100 ms) and Debian's Chromium through Playwright on the console's chat view. For each
``assistant`` event of the run, the time Redis stored it (its stream id, ms) against the
first time the page's text reached its length (a MutationObserver installed by the test,
``Date.now()``: the same machine clock). That is the gateway's SSE relay plus the browser;
the worker holds text for at most ``DELTA_INTERVAL_S`` (50 ms) before it writes an event,
reported apart. Median, p95 and max over every delta of ``--turns`` turns.

Run: ``.venv/bin/python benchmarks/console_stream_latency.py [--turns 5]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis

from benchmarks.turns import start
from fermix_dev.procs import Managed, stop_all
from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_shared import keys
from fermix_worker.turn.events import DELTA_INTERVAL_S

OBSERVE = """() => { window.__marks = []; const el = document.getElementById('live-text');
  new MutationObserver(() => window.__marks.push([Date.now(), el.textContent.length]))
    .observe(el, {childList: true, characterData: true, subtree: true}); }"""


def one_turn(page: Any, r: redis.Redis, llm: ScriptedLLMServer, url: str) -> list[float]:
    page.goto(f"{url}/console/chat")
    page.evaluate(OBSERVE)
    text = f"latency-{uuid.uuid4().hex[:8]}"
    llm.script.push(Reply(" ".join(f"word{i}" for i in range(40)), match=text, chunk_delay=0.1))
    page.fill("#message", text)
    page.click("#send")
    page.wait_for_selector("#live-status:text-is('done')", timeout=60_000)
    run_id = page.get_attribute("#live", "data-run")
    marks: list[list[int]] = page.evaluate("window.__marks")
    out, length = [], 0
    for entry_id, fields in r.xrange(keys.run_events(str(run_id)), "-", "+"):
        if fields["stream"] != "assistant":
            continue
        length += len(json.loads(fields["data"]).get("delta", ""))
        stored = int(entry_id.split("-")[0])
        shown = next((t for t, n in marks if n >= length), None)
        if shown is not None:
            out.append(float(shown - stored))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=5)
    a = p.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("no chromium on PATH (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    procs: list[Managed] = []
    with tempfile.TemporaryDirectory() as tmp, ScriptedLLMServer() as llm:
        try:
            url, redis_url = start(argparse.Namespace(concurrency=20, workers=1), Path(tmp),
                                   llm, procs)
            r = redis.Redis.from_url(redis_url, decode_responses=True)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_context().new_page()
                page.goto(f"{url}/console/login")
                page.click("#signin")  # an open gateway: the empty token is the admin
                page.wait_for_url(f"{url}/console")
                one_turn(page, r, llm, url)  # warm-up
                lat = [x for _ in range(a.turns) for x in one_turn(page, r, llm, url)]
                browser.close()
        finally:
            stop_all(procs)
    lat.sort()
    p95 = lat[max(0, int(len(lat) * 0.95) - 1)]
    print(f"deltas: {len(lat)} over {a.turns} turns; stored -> shown: median "
          f"{statistics.median(lat):.1f} ms, p95 {p95:.1f} ms, min {lat[0]:.1f}, max "
          f"{lat[-1]:.1f}; the worker's coalescing adds at most {DELTA_INTERVAL_S * 1000:.0f} ms")


if __name__ == "__main__":
    main()
