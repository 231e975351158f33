"""The quickstart's one-time setup, timed from a fresh clone: ``source scripts/_venv.sh`` (what
both README commands run first), then ``bash scripts/dev.sh --check`` (setup, the whole stack,
one turn), for one or two commits, alternating A B A B so a drift of the machine hits both.

    .venv/bin/python benchmarks/install_time.py --commit 5e0e378 --commit HEAD --repeat 3

Each run clones the commit into a new temporary folder (the package caches of pip and uv stay
warm, as on a developer's machine after the first install; say so when quoting). Prints, per
commit and step, the median and min-max wall seconds. ``--env K=V`` sets a variable for the
runs (``FERMIX_INSTALLER=pip`` times the pip fallback).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = {
    "setup (source scripts/_venv.sh)": ["bash", "-c", "source scripts/_venv.sh"],
    "dev.sh --check after setup": ["bash", "scripts/dev.sh", "--check"],
}


def one_run(commit: str, env: dict[str, str]) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="fermix-install-"))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
        subprocess.run(["git", "checkout", "-q", commit], cwd=work, check=True)
        times = {}
        for name, cmd in STEPS.items():
            start = time.perf_counter()
            done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=900)
            times[name] = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"{commit}: {name} failed ({done.returncode}):\n"
                                 f"{done.stderr[-2000:]}")
        return times
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", action="append", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--env", action="append", default=[], metavar="K=V")
    a = parser.parse_args()
    env = {**os.environ, **dict(kv.split("=", 1) for kv in a.env)}
    commits = [subprocess.run(["git", "rev-parse", "--short", c], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip() for c in a.commit]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; uv on PATH: {bool(shutil.which('uv'))}; "
          f"extra env: {a.env or 'none'}; repeat {a.repeat}")
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in commits}
    for _ in range(a.repeat):
        for c in commits:
            runs[c].append(one_run(c, env))
    for c in commits:
        for name in STEPS:
            xs = [r[name] for r in runs[c]]
            print(f"{c}  {name:32}  median {statistics.median(xs):6.1f} s  "
                  f"(min {min(xs):.1f}, max {max(xs):.1f})")


if __name__ == "__main__":
    main()
