"""What a budget reservation adds to a model call: reserve before, settle after, against charge
alone (no reservation), on a private redis-server.

One "call" here is the usage bookkeeping of one model call charged to a turn's four scopes
(total, agent, conversation, user) with a budget on the agent and on the conversation (day and
hour): with reservations, one MULTI of ``usage_release`` + ``usage_reserve`` before and one of
``usage_release`` + ``usage_record`` after; without, the ``usage_record`` alone. Reported: the
client-observed time per call (sequential, one connection), median and spread over repeats,
and the difference.

Run: ``.venv/bin/python benchmarks/reservation.py [--calls 3000] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import redis

from fermix_dev.procs import start_redis
from fermix_shared.usage import budgets
from fermix_shared.usage.budgets import Budget
from fermix_shared.usage.prices import ModelPrice, PriceCatalog
from fermix_shared.usage.scopes import Attribution
from fermix_worker.usage.meter import UsageMeter

WHO = Attribution("ops", "telegram|123456789|root", "telegram:42", "run_1")
PRICES = {"m": ModelPrice(input=3.0, output=15.0)}


def per_call_us(meter: UsageMeter, calls: int, reserve: bool) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        rid = meter.reserve("m", 2_000, 1_000, WHO) if reserve else ""
        meter.charge(["m"], 1_900, 300, WHO, rid)
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            r = redis.Redis.from_url(url, decode_responses=True)
            for scope in ("agent:ops", f"conversation:{WHO.conversation}"):
                for period in ("hour", "day"):
                    budgets.put(r, Budget(scope=scope, period=period, usd_micros=10**12))
            meter = UsageMeter(r, PriceCatalog(PRICES))
            per_call_us(meter, 200, True)  # load the scripts, warm the connection
            plain, reserved = [], []
            for _ in range(a.repeat):  # alternate, so drift hits both alike
                plain.append(per_call_us(meter, a.calls, False))
                reserved.append(per_call_us(meter, a.calls, True))
            added = [b - c for b, c in zip(reserved, plain, strict=True)]
            for name, xs in (("charge alone", plain), ("reserve + settle", reserved),
                             ("added by the reservation", added)):
                print(f"{name}: median {statistics.median(xs):.0f} µs per call "
                      f"(min {min(xs):.0f}, max {max(xs):.0f})")
            left = r.hlen("fx:usage:reservations")
            print(f"reservations left held: {left}")
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
