"""Audit append cost: one EVALSHA of ``audit_append.lua`` per entry (sha256 of the link in Lua).

Starts a private redis-server and reports, for a typical tool-call entry: the client-observed
time of one append (sequential, one connection), the Redis CPU one append takes (INFO
commandstats, ``evalsha`` ``usec_per_call``), appends per second from T threads (one client
each, as T worker processes would), and the time ``verify`` takes per entry.

Run: ``.venv/bin/python benchmarks/audit_append.py [--appends 5000] [--threads 8]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import redis

from fermix_dev.procs import start_redis
from fermix_shared import audit
from fermix_shared.audit import AuditLog

WHO = audit.Who(actor="telegram:123456789", run_id="run_" + "a" * 32,
                conv="telegram|123456789|root", agent="default")


def one(r: redis.Redis) -> None:
    audit.record(r, "tool", "calculator", "ok", **WHO, check="pass", call_id="call_abc123",
                 ms=1.3, args_sha256="f" * 64, args_len=42, trust="operator")


def appender(url: str, n: int) -> None:
    """One thread's appends, on its own connection (as one worker process would)."""
    c = redis.Redis.from_url(url, decode_responses=True)
    for _ in range(n):
        one(c)
    c.close()


def evalsha_usec(r: redis.Redis) -> float:
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", 0.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--appends", type=int, default=5000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            r = redis.Redis.from_url(url, decode_responses=True)
            one(r)  # load the script
            seq_us, server_us, rates = [], [], []
            for _ in range(a.repeat):
                r.config_resetstat()
                t = time.perf_counter()
                for _ in range(a.appends):
                    one(r)
                seq_us.append((time.perf_counter() - t) / a.appends * 1e6)
                server_us.append(evalsha_usec(r))
                per = a.appends // a.threads

                threads = [threading.Thread(target=appender, args=(url, per))
                           for _ in range(a.threads)]
                t = time.perf_counter()
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                rates.append(per * a.threads / (time.perf_counter() - t))
            log = AuditLog(r)
            t = time.perf_counter()
            result = log.verify()
            verify_us = (time.perf_counter() - t) / max(1, result.count) * 1e6
            size = r.memory_usage("fx:{audit}:entries") or 0
            print(f"append, sequential (client-observed): median {statistics.median(seq_us):.0f} µs"
                  f" (min {min(seq_us):.0f}, max {max(seq_us):.0f})")
            print(f"append, Redis CPU (evalsha usec_per_call): median "
                  f"{statistics.median(server_us):.0f} µs")
            print(f"{a.threads} threads: median {statistics.median(rates):.0f} appends/s "
                  f"(min {min(rates):.0f}, max {max(rates):.0f})")
            print(f"verify: {verify_us:.1f} µs per entry; {result.describe()[:60]}…")
            print(f"memory: {size / max(1, result.count):.0f} bytes per entry")
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
