"""``fermix audit tail | verify | export``: the fleet's audit trail, straight from Redis
(``FERMIX_REDIS_URL``), like ``fermix schedule`` and ``fermix skills``.

``tail`` prints the newest entries (of one agent or run), oldest of them first. ``verify``
walks the hash chain from its anchor to its head: exit 0 with "audit chain OK: N entries from
#a to #b", exit 1 naming the first entry that does not verify and why (missing, unreadable,
seq, prev or hash mismatch); ``--file`` checks an exported file instead. ``export`` writes the
entries as JSON Lines for long-term storage (``--since SEQ``: only those after it). An
unreachable Redis exits 1.

On a terminal ``tail`` is a table; ``verify`` and ``export`` show how far they are on stderr.
``--json`` prints one JSON document (``tail``: the entries; ``verify``: the result, also when
it fails; ``export``: what was written).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from fermix_cli import output
from fermix_shared.audit import AuditEntry, AuditLog, ChainPoint, Verified, verify


class _Counted(AuditLog):
    """The log, each entry it reads (for verify, for export) counted on ``steps``."""

    def __init__(self, r: redis.Redis, steps: output.Steps):
        super().__init__(r)
        self._steps = steps

    def raw(self, first: int, last: int) -> Iterator[str | None]:
        self._steps.expect(max(0, last - first + 1))
        return self._steps.track(super().raw(first, last))


def _log(steps: output.Steps | None = None) -> AuditLog:
    from fermix_shared.redis.client import cli_redis

    return AuditLog(cli_redis()) if steps is None else _Counted(cli_redis(), steps)


def _when(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _short(value: object) -> str:
    text = str(value)
    return text[:12] + "…" if len(text) == 64 and all(c in "0123456789abcdef" for c in text) \
        else text


def format_entry(e: AuditEntry) -> str:
    """One line: seq, time, kind, action, outcome, actor, then agent, run, conv and detail."""
    where = [f"{k}={v}" for k, v in (("agent", e.agent), ("run", e.run), ("conv", e.conv)) if v]
    detail = [f"{k}={_short(v)}" for k, v in sorted(e.detail.items())]
    return "  ".join([f"#{e.seq}", _when(e.ts), e.kind, e.action, e.outcome, e.actor,
                      *where, *detail])


def _row(e: AuditEntry) -> list[output.Cell]:
    where = [f"{k}={v}" for k, v in (("agent", e.agent), ("run", e.run), ("conv", e.conv)) if v]
    detail = [f"{k}={_short(v)}" for k, v in sorted(e.detail.items())]
    return [f"#{e.seq}", _when(e.ts), e.kind, e.action, output.state(e.outcome), e.actor,
            " ".join(where), " ".join(detail)]


def _tail(a: argparse.Namespace) -> int:
    entries = _log().recent(agent=a.agent, run=a.run, limit=a.n)
    entries.reverse()  # oldest first, like tail
    if a.json:
        output.print_json([e.model_dump(mode="json") for e in entries])
    elif not entries:
        print("No audit entries" + (" match." if a.agent or a.run else " yet."))
    elif (console := output.terminal()) is not None:
        output.table(console, ("SEQ", "TIME", "KIND", "ACTION", "OUTCOME", "ACTOR", "WHERE",
                               "DETAIL"), [_row(e) for e in entries])
    else:
        print("\n".join(format_entry(e) for e in entries))
    return 0


def _file_entries(path: Path) -> tuple[ChainPoint, list[str]]:
    """An exported file's entries, anchored on its first entry's ``prev`` (the file says where
    it starts; the chain must hold from there)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return ChainPoint.origin(), []
    try:
        first = json.loads(lines[0])
        anchor = ChainPoint(int(first["seq"]) - 1, str(first["prev"]))
    except (ValueError, KeyError, TypeError):
        anchor = ChainPoint.origin()
    return anchor, lines


def verified_json(result: Verified) -> dict[str, Any]:
    """What ``fermix audit verify --json`` prints."""
    broken = result.broken
    return {"ok": result.ok, "count": result.count, "first": result.first, "last": result.last,
            "anchor": result.anchor.seq, "headHash": result.last_hash if result.ok else None,
            "broken": None if broken is None else {
                "seq": broken.seq, "problem": broken.problem, "detail": broken.detail},
            "message": result.describe()}


def _verify(a: argparse.Namespace) -> int:
    result: Verified
    with output.steps("audit verify: checking the hash chain", counted=True) as steps:
        if a.file is not None:
            anchor, lines = _file_entries(Path(a.file))
            steps.expect(len(lines))
            result = verify(anchor, steps.track(lines))
        else:
            result = _log(steps).verify()
    if a.json:
        output.print_json(verified_json(result))
    elif result.ok:
        print(result.describe())
    if not result.ok:
        print(f"fermix: {result.describe()}", file=sys.stderr)
        return 1
    return 0


def _export(a: argparse.Namespace) -> int:
    with output.steps(f"audit export: writing {a.file}", counted=True) as steps:
        if a.file == "-":
            _log(steps).export(sys.stdout, a.since)  # the entries are the output
            return 0
        with open(a.file, "w", encoding="ascii") as out:
            count, first, last = _log(steps).export(out, a.since)
    if a.json:
        output.print_json({"file": a.file, "count": count, "first": first, "last": last})
    elif count:
        print(f"Exported {count} audit entries (#{first} to #{last}) to {a.file}.")
    else:
        print(f"No audit entries to export; {a.file} is empty.")
    return 0


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(a: argparse.Namespace) -> int:
        try:
            return func(a)
        except redis.RedisError as e:
            print(f"fermix: cannot reach Redis ({e})", file=sys.stderr)
            return 1
        except OSError as e:
            print(f"fermix: {e}", file=sys.stderr)
            return 1

    return run


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"expected a number of entries (1-10000), not {text!r}")
    return value


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a sequence number (>= 0), not {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit`` and its subcommands on the ``fermix`` parser."""
    cmds = sub.add_parser("audit", help="the audit trail (Redis): tail, verify, export"
                          ).add_subparsers(dest="audit_command", required=True)
    tail = cmds.add_parser("tail", help="the newest entries, oldest of them first")
    tail.add_argument("--agent", default=None, help="only this agent's entries")
    tail.add_argument("--run", default=None, help="only this run's entries")
    tail.add_argument("-n", type=_count, default=20, metavar="N", help="how many (default 20)")
    tail.add_argument("--json", action="store_true", help="print the entries as JSON")
    tail.set_defaults(func=_guarded(_tail))
    ver = cmds.add_parser("verify", help="check the hash chain from its anchor to its head")
    ver.add_argument("--file", default=None, help="check an exported JSON Lines file instead")
    ver.add_argument("--json", action="store_true", help="print the result as JSON")
    ver.set_defaults(func=_guarded(_verify))
    exp = cmds.add_parser("export", help="write the entries as JSON Lines ('-': stdout)")
    exp.add_argument("file", metavar="FILE")
    exp.add_argument("--since", type=_seq, default=None, metavar="SEQ",
                     help="only entries after this sequence number")
    exp.add_argument("--json", action="store_true", help="print what was written as JSON")
    exp.set_defaults(func=_guarded(_export))
