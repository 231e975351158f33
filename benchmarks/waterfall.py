"""Issue 31's latency waterfall: where one turn's time goes, accept to reply, step by step.

One private stack as ``benchmarks/perf.py`` runs it (redis-server, the in-process scripted
model at ~1 ms, the gateway, 2 gevent workers x 64 slots at nice 10), with tracing on: every
process exports its spans over OTLP/HTTP to a fake collector in this process
(fermix_dev/otlp_collector.py). Turns run one at a time, each in its own chat (perf.py's row
a). For each turn the client notes when it sent the POST, when the 202 came and when ``/wait``
answered; the spans (same host, one clock) give every step between. Printed: the median and
the spread (p10-p90) of each step over the turns, their sum against the measured total, and
the CPU each process spent per turn (tracing's spans included, their export not: spans wait in
memory until the processes stop, then go to the collector).

    .venv/bin/python benchmarks/perf.py --waterfall            # 100 turns
    .venv/bin/python benchmarks/waterfall.py --turns 200

The steps (span names in brackets) are the turn's critical path in order: the HTTP request to
the accept [fermix.accept], the publisher thread's broker write [fermix.publish], the broker
delivering the dispatch to a worker and Celery starting it (the gap to [fermix.claim]), the
claim, the turn's admission and prompt [fermix.admit, fermix.prepare], its first writes
(checkpoint, record, history, run record and started event [fermix.run_start]), the model call
to its first and last byte [chat ...], what follows it until the finish [fermix.finish]: the
delivery [fermix.deliver], the post-turn listeners [fermix.listeners], the end event
[fermix.end_event], and the end event reaching the client through ``/wait``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import turns  # noqa: E402
from fermix_dev.otlp_collector import CollectedSpan, OTLPCollector  # noqa: E402
from fermix_dev.procs import Managed  # noqa: E402
from fermix_dev.scripted_llm import ScriptedLLMServer  # noqa: E402

FAST = 0.001  # the "~1 ms" model
WORKER_NICE = "10"
NEEDED = ("fermix.accept", "fermix.publish", "fermix.claim", "fermix.turn", "fermix.end_event")
# (label, start mark, end mark): marks are "<span>.start"/"<span>.end", "chat.first" (the
# first streamed byte) or the client's "sent", "accepted", "answered".
STEPS = [
    ("client → gateway: HTTP, auth, body", "sent", "fermix.accept.start"),
    ("accept: the accept script, WAIT", "fermix.accept.start", "fermix.accept.end"),
    ("  (202 back to the client)", "fermix.accept.end", "accepted"),
    ("publish: queued → on the broker", "fermix.publish.start", "fermix.publish.end"),
    ("broker → worker: delivery, Celery", "fermix.publish.end", "fermix.claim.start"),
    ("claim: mode, the claim script", "fermix.claim.start", "fermix.claim.end"),
    ("claim → turn span", "fermix.claim.end", "fermix.turn.start"),
    ("admit: the turn's reads, budgets, compaction", "fermix.admit.start", "fermix.admit.end"),
    ("prepare: hooks, prompt, facts, skills", "fermix.prepare.start", "fermix.prepare.end"),
    ("first writes: checkpoint, record, history", "fermix.prepare.end",
     "fermix.run_start.start"),
    ("run start: record and started event", "fermix.run_start.start", "fermix.run_start.end"),
    ("→ model call: live reply, sink, driver", "fermix.run_start.end", "chat.start"),
    ("model: to the first byte", "chat.start", "chat.first"),
    ("model: first → last byte", "chat.first", "chat.end"),
    ("after the call: record, checkpoint, loop", "chat.end", "fermix.finish.start"),
    ("finish: reply, record end + measurement", "fermix.finish.start", "fermix.deliver.start"),
    ("deliver: compare-and-deliver, release", "fermix.deliver.start", "fermix.deliver.end"),
    ("deliver → listeners", "fermix.deliver.end", "fermix.listeners.start"),
    ("listeners: post-turn work", "fermix.listeners.start", "fermix.listeners.end"),
    ("end event: lifecycle end", "fermix.end_event.start", "fermix.end_event.end"),
    ("end event → /wait answered at the client", "fermix.end_event.end", "answered"),
]
CRITICAL = [s for s in STEPS if not s[0].startswith("  (")]


def marks(spans: list[CollectedSpan], client: dict[str, int]) -> dict[str, int]:
    """A turn's marks (ns since the epoch): each span's start and end (its first, for the
    checkpoint and record spans that repeat), the model call's first byte, the client's."""
    out = dict(client)
    for s in sorted(spans, key=lambda s: s.start_ns):
        name = "chat" if s.name.startswith("chat ") else s.name
        if f"{name}.start" in out:
            continue
        out[f"{name}.start"], out[f"{name}.end"] = s.start_ns, s.end_ns
        if name == "chat" and (ttft := s.attributes.get("fermix.ttft_ms")) is not None:
            out["chat.first"] = s.start_ns + int(float(str(ttft)) * 1e6)
    return out


def steps_of(m: dict[str, int]) -> dict[str, float]:
    """Each step's time (ms) in one turn; a step whose marks are missing is left out."""
    return {label: (m[b] - m[a]) / 1e6 for label, a, b in STEPS if a in m and b in m}


async def serial_turns(url: str, llm: ScriptedLLMServer, tag: str, n: int
                       ) -> list[dict[str, Any]]:
    tokens = [f"[{tag}-{i:04d}]" for i in range(n)]
    llm.script.push(*(turns.scripted_reply(t, FAST) for t in tokens))
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        for i, t in enumerate(tokens):
            sent = time.time_ns()
            a = await turns.post(c, f"{tag}-{i}", f"bench turn {t}")
            accepted = time.time_ns()
            d = await turns.wait(c, a["runId"], time.monotonic() + 60)
            out.append({"runId": a["runId"], "status": d["status"], "sent": sent,
                        "accepted": accepted, "answered": time.time_ns()})
    return out


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def collect(collector: OTLPCollector, done: list[dict[str, Any]]) -> dict[str, list[CollectedSpan]]:
    """Every turn's spans by run id, once each turn's trace has the spans the steps need."""
    ids = {d["runId"] for d in done}

    def by_run(spans: list[CollectedSpan]) -> dict[str, list[CollectedSpan]]:
        trace_of = {str(s.attributes["fermix.run_id"]): s.trace_id for s in spans
                    if s.name == "fermix.accept" and s.attributes.get("fermix.run_id") in ids}
        grouped: dict[str, list[CollectedSpan]] = defaultdict(list)
        for s in spans:
            grouped[s.trace_id].append(s)
        return {run: grouped[trace] for run, trace in trace_of.items()}

    def complete(spans: list[CollectedSpan]) -> bool:
        got = by_run(spans)
        return len(got) == len(ids) and all(
            {s.name for s in v} >= set(NEEDED) for v in got.values())

    return by_run(collector.wait_for(complete, timeout=60))


def report(per_turn: list[dict[str, float]], totals: list[float], cpu: dict[str, float],
           n: int) -> str:
    def q(vals: list[float], p: float) -> float:
        return sorted(vals)[min(len(vals) - 1, int(p * len(vals)))]

    lines = [f"{'step':<46} {'median':>8} {'p10-p90':>15}   ms, over {n} turns"]
    crit = 0.0
    for label, _, _ in STEPS:
        vals = [t[label] for t in per_turn if label in t]
        if not vals:
            lines.append(f"{label:<46} {'—':>8}")
            continue
        med = statistics.median(vals)
        if not label.startswith("  ("):
            crit += med
        lines.append(f"{label:<46} {med:8.2f} {q(vals, 0.1):7.2f}-{q(vals, 0.9):<7.2f}")
    total = statistics.median(totals)
    lines.append(f"{'sum of the step medians':<46} {crit:8.2f}")
    lines.append(f"{'measured: sent → answered, median':<46} {total:8.2f} "
                 f"{q(totals, 0.1):7.2f}-{q(totals, 0.9):<7.2f}")
    lines.append("CPU per turn (ms; tracing's spans made, not exported): " + ", ".join(
        f"{k} {v:.2f}" for k, v in cpu.items()))
    return "\n".join(lines)


def run(n: int, warm: int = 20) -> str:
    procs: list[Managed] = []
    with tempfile.TemporaryDirectory(prefix="fermix-waterfall-") as tmp, \
            ScriptedLLMServer() as llm, OTLPCollector() as collector:
        try:
            url, redis_url = turns.start(
                argparse.Namespace(workers=2, concurrency=64), Path(tmp), llm, procs,
                extra_env={"FERMIX_WORKER_NICE": WORKER_NICE,
                           "FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "3600",
                           "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                           # Spans wait in memory until the processes stop: no export (its
                           # CPU, and the collector's decoding in this process, beside the
                           # scripted model) while the turns run.
                           "OTEL_BSP_SCHEDULE_DELAY": "3600000",
                           "OTEL_BSP_MAX_QUEUE_SIZE": "1000000",
                           "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1000000"})
            r = redis.Redis.from_url(redis_url)
            asyncio.run(serial_turns(url, llm, "warm", warm))  # pools, imports
            named = {p.name: p for p in procs if p.name == "gateway" or p.name.startswith("bench-w")}
            cpu0 = {k: turns.cpu_seconds(p.pid) for k, p in named.items()}
            rcpu0 = redis_cpu_s(r)
            done = asyncio.run(serial_turns(url, llm, "wf", n))
            cpu1 = {k: turns.cpu_seconds(p.pid) for k, p in named.items()}
            assert all(d["status"] == "ok" for d in done), [d["status"] for d in done]
            cpu = {"gateway": 1000 * (cpu1["gateway"] - cpu0["gateway"]) / n,
                   "workers": 1000 * sum(cpu1[k] - cpu0[k] for k in cpu1
                                         if k.startswith("bench-w")) / n,
                   "redis-server": 1000 * (redis_cpu_s(r) - rcpu0) / n}
            for proc in reversed(procs):  # each flushes its spans as it stops
                proc.stop()
            spans = collect(collector, done)
            per_turn = [steps_of(marks(spans[d["runId"]], {k: d[k] for k in
                                                            ("sent", "accepted", "answered")}))
                        for d in done]
            totals = [(d["answered"] - d["sent"]) / 1e6 for d in done]
            return report(per_turn, totals, cpu, n)
        finally:
            for proc in reversed(procs):
                proc.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=100, help="serial turns measured")
    a = p.parse_args(argv)
    if not 1 <= a.turns <= 5000:
        p.error("--turns is 1 to 5000")
    print(run(a.turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
