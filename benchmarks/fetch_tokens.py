"""Tokens per fetched page: what ``http_fetch`` hands the model for an HTML page, as raw HTML
(the form before issue 32, now ``raw=true``) and as Markdown (the default).

The saved pages under ``tests/worker/tools/pages/`` are served from 127.0.0.1 and fetched
through the real tool and registry (the private-address check lifted for loopback, nothing
leaves the machine). Counted is the tool result exactly as the model gets it: status lines,
text, notes, the registry's 20,000-character cut and the untrusted-content fence ("HTML
tokens, uncut" is the whole page, what the tool passed on before that cut). Tokens are
fermix's own report estimate (:func:`fermix_worker.compaction.estimate_tokens`, characters / 4);
tiktoken is not a dependency. Markup tokenizes denser than prose, so the estimate undercounts
the raw HTML more than the Markdown, and the real saving is larger than shown. "Content
reached" says whether the article's last paragraph is in what the model gets. Conversion time
is :func:`fermix_worker.tools.web_text.readable` alone, median over ``--repeat`` runs after one
warm-up (which pays trafilatura's import).

Run: ``.venv/bin/python benchmarks/fetch_tokens.py [--repeat 20]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_worker.compaction import estimate_tokens
from fermix_worker.tools import OPERATOR, RunContext, ToolRegistry
from fermix_worker.tools.web import FETCH_MAX_CHARS, CheckedBackend, http_fetch_tool
from fermix_worker.tools.web_text import readable

PAGES = Path(__file__).resolve().parents[1] / "tests" / "worker" / "tools" / "pages"
# Each saved page: the content type it is served with, and a phrase of its last paragraph.
SERVED = {
    "docs_article.html": ("text/html; charset=utf-8", "check that you reuse one client"),
    "news_article.html": ("text/html; charset=utf-8", "The closure is due to start on 1 April"),
    "table_page.html": ("application/xhtml+xml", "we answer within three working days"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        name = self.path.strip("/")
        body = (PAGES / name).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", SERVED[name][0])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def tokens(text: str) -> int:
    """Fermix's report estimate of ``text`` as one tool message."""
    return estimate_tokens([ChatMessage(role="tool", content=text)])


def fetched(tools: ToolRegistry, url: str, raw: bool) -> str:
    """The tool result the model gets (fenced, cut by the registry)."""
    call = ToolCall(id="c", name="http_fetch", arguments={"url": url, "raw": raw})
    result = tools.execute(call, RunContext())
    assert not result.is_error, result.content
    return result.content


def conversion_ms(html: str, url: str, repeat: int) -> float:
    readable(html, url, FETCH_MAX_CHARS)  # warm-up
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        readable(html, url, FETCH_MAX_CHARS)
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="conversion timings per page")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tools = ToolRegistry([http_fetch_tool(lambda: CheckedBackend(allow_private=True))]).scoped(
        OPERATOR)
    print(f"python {platform.python_version()}, {platform.machine()}, "
          f"repeat {args.repeat}; tokens = characters / 4 (fermix's estimate)\n")
    print("| page | HTML bytes | HTML tokens, uncut | before: chars / tokens | content reached | "
          "after: chars / tokens | content reached | after / before | converter | convert ms |")
    print("| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | --- | ---: |")
    for name, (_, last) in SERVED.items():
        url = f"http://127.0.0.1:{server.server_address[1]}/{name}"
        html = (PAGES / name).read_text(encoding="utf-8")
        before, after = fetched(tools, url, raw=True), fetched(tools, url, raw=False)
        page = readable(html, url, FETCH_MAX_CHARS)
        ms = conversion_ms(html, url, args.repeat)
        print(f"| {name} | {len(html.encode()):,} | {tokens(html):,} | "
              f"{len(before):,} / {tokens(before):,} | "
              f"{'yes' if last in before else 'no'} | {len(after):,} / {tokens(after):,} | "
              f"{'yes' if last in after else 'no'} | {tokens(after) / tokens(before):.2f} | "
              f"{page.converter} | {ms:.1f} |")
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    main()
