"""``fermix worker``: exec a Celery worker that runs turns, at the CPU priority asked for.

Apart from :mod:`fermix_cli.main` and free of heavy imports, because all it does is lower its
own priority and exec Celery: ``python -m fermix_cli.worker`` (what ``fermix dev`` runs) starts
the worker without first loading the rest of the CLI.

Priority (``--nice N`` or ``FERMIX_WORKER_NICE``, 0 to 19, default 0): a gateway on the same
host must keep answering webhooks while workers saturate the CPU, so run the workers niced.
The niceness is set before the exec and Celery inherits it.

Celery's ``mingle`` (asking other workers for revoked task ids at start: a 1 s wait) and
``gossip`` (every worker consuming every other worker's events) are off: Fermix revokes no
task and judges workers by its own heartbeat in Redis. Task events (``-E``, for Flower) stay on.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

CELERY_APP = "fermix_shared.celery_app:app"
NICE_ENV = "FERMIX_WORKER_NICE"
MAX_NICE = 19


def niceness(text: str) -> int:
    """Parse a niceness for ``--nice`` / FERMIX_WORKER_NICE: a whole number from 0 to 19."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_NICE:
        raise argparse.ArgumentTypeError(
            f"expected a niceness from 0 (normal) to {MAX_NICE} (lowest priority), not {text!r} "
            f"(from --nice or {NICE_ENV})")
    return value


def lower_priority(nice: int) -> int:
    """Set this process's niceness to ``nice`` unless it is already at least that (lowering
    priority needs no privilege, raising it does); returns the niceness now in force."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        return nice
    return current


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's options (``fermix worker`` and ``python -m fermix_cli.worker``)."""
    p.add_argument("--concurrency", type=int, default=100, help="concurrent turns (greenlets)")
    p.add_argument("--pool", default="gevent", choices=["gevent", "threads", "solo"])
    p.add_argument("--name", default=None, help="Celery node name, e.g. w1@%%h")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--nice", type=niceness, default=os.environ.get(NICE_ENV) or "0", metavar="N",
                   help=f"run at niceness N, 0-19 (default {NICE_ENV}, else 0): a gateway on "
                        "the same host keeps its CPU while workers are busy")


def celery_argv(a: argparse.Namespace) -> list[str]:
    """The ``python -m celery ... worker`` command line for the parsed options."""
    args = [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "-P", a.pool,
            "-c", str(a.concurrency), "-E", "-l", a.log_level, "-Q", "fermix.turns",
            "--without-mingle", "--without-gossip"]
    if a.name:
        args += ["-n", a.name]
    return args


def run(a: argparse.Namespace) -> int:
    """Lower the priority, then become the Celery worker (never returns)."""
    lower_priority(a.nice)
    env = dict(os.environ, FERMIX_WORKER_CONCURRENCY=str(a.concurrency))
    argv = celery_argv(a)
    os.execve(sys.executable, argv, env)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="fermix worker",
                                description="run a Celery worker that runs turns")
    add_arguments(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
