"""Lease renewal cost: one worker process holding N running turns (issue 17, row f's shape).

Starts a private redis-server, claims N conversations (a 30 s lease each, as the worker's
default) and holds a :class:`~fermix_worker.turn.lease.LeaseKeeper` on every one of them, the
way N slow turns in one worker process do, under the gevent pool (the worker's default) or
real threads (``--pool threads``). After one interval of warm-up it measures, over
``--seconds``:

- this process's CPU (user + system, ``getrusage``) as % of one core;
- round trips to Redis per second (requests written on the keepers' client: a pipeline is one);
- renewals per second as Redis counts them (INFO commandstats ``evalsha`` calls) and Redis's
  own CPU;
- the connections the process holds to Redis at the end, and those it opened per second;
- that every lease's ``lease_until`` moved forward.

Run: ``.venv/bin/python benchmarks/lease_renewals.py [--leases 1000] [--seconds 10]
[--interval 0.5] [--pool gevent|threads] [--repeat 3]``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and "threads" not in sys.argv:
    from gevent import monkey  # the worker's pool: patch before anything imports sockets

    monkey.patch_all()

import argparse  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import redis  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fermix_dev.procs import start_redis  # noqa: E402
from fermix_shared import keys  # noqa: E402
from fermix_shared.models import ConversationKey, InboundMessage  # noqa: E402
from fermix_shared.stores import queue  # noqa: E402
from fermix_shared.stores.lease import TurnLease  # noqa: E402
from fermix_worker.turn.lease import LeaseKeeper  # noqa: E402

LEASE_S = 30.0
WARM_UP_S = 3.0
WORKER = "bench@host"


class CountingConnection(redis.Connection):
    """A connection that counts the requests it writes (a pipeline is written once)."""

    sent = 0
    _lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with CountingConnection._lock:
            CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def sent_so_far() -> int:
    return CountingConnection.sent


def claim_many(r: redis.Redis, n: int) -> list[TurnLease]:
    leases = []
    for _ in range(n):
        key = ConversationKey(channel="http", chat_id=uuid.uuid4().hex[:12])
        msg = InboundMessage(run_id=f"run_{uuid.uuid4().hex}", key=key, text="hi", sender_id="u")
        queue.accept(r, msg)
        claim, lease = queue.claim(r, key.as_str(), WORKER, LEASE_S)
        assert claim.kind == "claimed" and lease is not None
        leases.append(lease)
    return leases


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def lease_untils(r: redis.Redis, convs: list[str]) -> list[int]:
    pipe = r.pipeline(transaction=False)
    for conv in convs:
        pipe.hget(keys.active(conv), "lease_until")
    return [int(v) for v in pipe.execute()]


def one_run(url: str, n: int, seconds: float, interval: float) -> dict[str, float]:
    admin = redis.Redis.from_url(url, decode_responses=True)
    admin.flushdb()
    # The worker's pool (fermix_shared.redis.client.make_redis): concurrency + 100 connections.
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=n + 100, timeout=30, socket_timeout=10, decode_responses=True,
        connection_class=CountingConnection)
    held = redis.Redis(connection_pool=pool)
    setup = claim_many(admin, n)
    leases = [TurnLease(held, x.conv, x.turn_id, x.worker, LEASE_S) for x in setup]
    convs = [x.conv for x in leases]
    with ExitStack() as stack:
        for lease in leases:
            stack.enter_context(LeaseKeeper(lease, interval))
        time.sleep(max(WARM_UP_S, interval * 2))  # every keeper renewed, the pool grown
        before = lease_untils(admin, convs)
        admin.config_resetstat()
        sent0, cpu0, rcpu0, t0 = sent_so_far(), cpu_s(), redis_cpu_s(admin), time.perf_counter()
        time.sleep(seconds)
        sent1, cpu1, rcpu1, t1 = sent_so_far(), cpu_s(), redis_cpu_s(admin), time.perf_counter()
        renewals = evalsha_calls(admin)
        connections = int(admin.info("clients")["connected_clients"]) - 1  # not admin's
        opened = int(admin.info("stats")["total_connections_received"])
        after = lease_untils(admin, convs)
    elapsed = t1 - t0
    moved = sum(b > a for a, b in zip(before, after, strict=True))
    admin.close()
    pool.disconnect()
    return {"cpu_pct": (cpu1 - cpu0) / elapsed * 100, "round_trips_s": (sent1 - sent0) / elapsed,
            "renewals_s": renewals / elapsed, "redis_cpu_pct": (rcpu1 - rcpu0) / elapsed * 100,
            "connections": connections, "opened_s": opened / elapsed, "moved": moved}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leases", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=0.5, help="FERMIX_CANCEL_POLL_SECONDS")
    p.add_argument("--pool", choices=("gevent", "threads"), default="gevent")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            runs = [one_run(url, a.leases, a.seconds, a.interval) for _ in range(a.repeat)]
        finally:
            proc.stop()
    print(f"{a.leases} leases held, interval {a.interval} s, pool {a.pool}, "
          f"{a.seconds:g} s x {a.repeat}")
    for field, label in (("cpu_pct", "worker CPU, % of a core"),
                         ("round_trips_s", "round trips to Redis /s"),
                         ("renewals_s", "renewals /s (evalsha)"),
                         ("redis_cpu_pct", "Redis CPU, % of a core"),
                         ("connections", "connections to Redis"),
                         ("opened_s", "connections opened /s")):
        values = [r[field] for r in runs]
        print(f"  {label:26} median {statistics.median(values):8.1f}"
              f"  (min {min(values):.1f}, max {max(values):.1f})")
    moved = min(r["moved"] for r in runs)
    print(f"  leases whose lease_until moved forward: {moved:.0f} of {a.leases}")


if __name__ == "__main__":
    main()
