"""``fermix usage`` and ``fermix budget set|list|rm``: what the model calls cost and the limits
on them, through the gateway (``GET /v1/usage``, ``/v1/budgets``), like ``fermix agents``.

``usage`` shows a scope's spending this hour, today and this month (UTC), or with ``--by`` a
series of hours, days or months, newest first; without a scope it shows the total and every
agent's spending today. ``--by kind`` splits the fleet's spending by what made the calls: turns,
scheduled runs, subagents, skill runs, compaction and the memory review. ``budget set --scope agent:ops --period day --usd 5`` (or
``--tokens N``, or both) sets a limit; at 80 % the conversation whose turn crossed it is
warned once, at 100 % new turns charged to the scope are refused until the period resets.
Tokens read from and written to the prompt cache and spent reasoning are shown apart when
there are any; models without a price are named ("priced at $0: unknown model ..."), and a
spending that includes their calls reads ``$X + unknown``.
Bad arguments exit 2; a gateway that cannot be reached or refuses exits 1 with a sentence.
On a terminal ``usage`` and ``budget list`` are tables; ``--json`` (on every subcommand) prints
the gateway's JSON.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fermix_cli import output
from fermix_cli.client import gateway_json, positive_int, refusals_as_exit_1
from fermix_shared.settings import Settings, get_settings
from fermix_shared.usage.budgets import format_usd, spend_text
from fermix_shared.usage.periods import ADJECTIVE, PERIODS
from fermix_shared.usage.scopes import parse_scope
from fermix_shared.usage.store import Totals

PERIOD_NAMES: dict[str, str] = {"hour": "this hour", "day": "today", "month": "this month"}


def _settings() -> Settings:
    return get_settings()


def _scope_arg(prefix: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return parse_scope(f"{prefix}{text}")
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _spend(j: dict[str, Any]) -> str:
    """A bucket's spending, with the parts of its tokens the provider reported apart."""
    t = Totals.from_json(j)
    parts = [f"{n:,} {what}" for n, what in ((t.cache_read_tokens, "cache read"),
                                              (t.cache_write_tokens, "cache write"),
                                              (t.reasoning_tokens, "reasoning")) if n]
    return spend_text(t) + (f" [{', '.join(parts)}]" if parts else "")


def unknown_models_line(unpriced: dict[str, int]) -> str:
    """The models whose calls had no price, by name (their calls are counted as $0)."""
    models = ", ".join(f"unknown model {m} ({n:,} call{'' if n == 1 else 's'})"
                       for m, n in sorted(unpriced.items()))
    return f"priced at $0: {models}; set [prices.\"MODEL\"] input/output to price them"


# The parts of a spending's tokens a table shows in their own column, when any row has some.
_PARTS = (("CACHE READ", "cacheReadTokens"), ("CACHE WRITE", "cacheWriteTokens"),
          ("REASONING", "reasoningTokens"))


def _spend_table(console: output.Console, title: str, first: list[str],
                 rows: list[tuple[list[str], dict[str, Any]]]) -> None:
    """Spendings as a table: the ``first`` columns, then cost, tokens, calls and the parts of
    the tokens there are any of; a cost with calls of an unpriced model reads ``$X + unknown``."""
    parts = [(h, k) for h, k in _PARTS if any(j.get(k) for _, j in rows)]
    body: list[list[output.Cell]] = []
    for cells, j in rows:
        t = Totals.from_json(j)
        cost = format_usd(t.usd_micros) + (" + unknown" if t.unpriced_calls else "")
        body.append([*cells, output.Text(cost, style="yellow" if t.unpriced_calls else ""),
                     f"{t.tokens:,}", f"{t.calls:,}", *(f"{j.get(k, 0):,}" for _, k in parts)])
    numbers = ["COST", "TOKENS", "CALLS", *(h for h, _ in parts)]
    output.table(console, [*first, *numbers], body, title=title, numbers=numbers)


def _usage_tables(console: output.Console, bodies: list[dict[str, Any]],
                  agents: dict[str, Any] | None) -> None:
    """``usage`` on a terminal: a table per scope (and its budgets), then the agents' today."""
    for body in bodies:
        if "buckets" in body:
            _spend_table(console, body["scope"], ["BUCKET"],
                         [([b["bucket"]], b) for b in body["buckets"]])
        else:
            _spend_table(console, body["scope"], ["PERIOD", "BUCKET"],
                         [([PERIOD_NAMES[p], v["bucket"]], v) for p, v in body["periods"].items()])
        if body["budgets"]:
            output.table(console, ("BUDGET", "PERIOD", "SPENT OF LIMIT", "USED", "RESETS"),
                         [_budget_row(b) for b in body["budgets"]])
    if agents is not None:
        _spend_table(console, f"agents today ({agents['bucket']})", ["AGENT"],
                     [([s["scope"].removeprefix("agent:")], s) for s in agents["scopes"]])


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _spent_of_limit(b: dict[str, Any]) -> list[str]:
    limit, spent = b["limit"], b["spent"]
    parts = []
    if limit["usd"] is not None:
        parts.append(f"{format_usd(round(spent['usd'] * 1e6))} of "
                     f"{format_usd(round(limit['usd'] * 1e6))}")
    if limit["tokens"] is not None:
        parts.append(f"{spent['tokens']:,} of {limit['tokens']:,} tokens")
    return parts


def _budget_state(b: dict[str, Any]) -> str:
    return "reached, new turns refused" if b["reached"] else f"{b['percent']:.0f}%"


def budget_line(b: dict[str, Any]) -> str:
    """One budget against its spending, as ``budget list`` and ``usage`` print it."""
    return (f"{b['scope']} {ADJECTIVE[b['period']]}: {', '.join(_spent_of_limit(b))} "
            f"({_budget_state(b)}), resets {_when(b['resetsAt'])}")


def _budget_row(b: dict[str, Any]) -> list[output.Cell]:
    state = _budget_state(b)
    style = "bold red" if b["reached"] else "yellow" if b["percent"] >= 80 else "green"
    return [b["scope"], ADJECTIVE[b["period"]], ", ".join(_spent_of_limit(b)),
            output.Text(state, style=style), _when(b["resetsAt"])]


def _scope_lines(body: dict[str, Any]) -> list[str]:
    lines = [body["scope"]]
    if "buckets" in body:
        lines += [f"  {b['bucket']:<14} {_spend(b)}" for b in body["buckets"]]
    else:
        lines += [f"  {PERIOD_NAMES[p]:<11} {v['bucket']:<14} {_spend(v)}"
                  for p, v in body["periods"].items()]
    lines += [f"  budget {budget_line(b)}" for b in body["budgets"]]
    return lines


def _by_kind(a: argparse.Namespace) -> int:
    if a.agent or a.conversation or a.user or a.last:
        print("fermix: --by kind is the whole fleet's (no --agent, --conversation, --user or "
              "--last)", file=sys.stderr)
        return 2
    body = gateway_json(_settings(), "GET", "/v1/usage", "usage request", params={"by": "kind"})
    if a.json:
        output.print_json(body)
        return 0
    if (console := output.terminal()) is not None:
        _spend_table(console, "total by kind", ["PERIOD", "KIND"],
                     [([f"{PERIOD_NAMES[p]} ({v['bucket']})", k["kind"]], k)
                      for p, v in body["periods"].items() for k in v["kinds"] if k["calls"]])
        return 0
    print("total by kind")
    for p, v in body["periods"].items():
        print(f"  {PERIOD_NAMES[p]} ({v['bucket']})")
        kinds = [k for k in v["kinds"] if k["calls"]]
        print("\n".join(f"    {k['kind']:<14} {_spend(k)}" for k in kinds)
              or "    none yet")
    return 0


def _usage(a: argparse.Namespace) -> int:
    if a.by == "kind":
        return _by_kind(a)
    settings = _settings()
    scopes = [*a.agent, *a.conversation, *a.user] or ["total"]
    params: dict[str, Any] = {}
    if a.by:
        params["by"] = a.by
    if a.last:
        params["last"] = a.last
    bodies = [gateway_json(settings, "GET", "/v1/usage", "usage request",
                           params={**params, "scope": s}) for s in scopes]
    agents = None
    if scopes == ["total"] and not a.by:
        agents = gateway_json(settings, "GET", "/v1/usage", "usage request",
                              params={"scope": "agent", "period": "day"})
    if a.json:
        output.print_json(bodies[0] if len(bodies) == 1 and agents is None
                          else {"usage": bodies, "agentsToday": agents})
        return 0
    unpriced = bodies[0].get("unpricedModels") or {}
    if (console := output.terminal()) is not None:
        _usage_tables(console, bodies, agents)
        if unpriced:
            console.print(output.Text(unknown_models_line(unpriced), style="yellow"))
        return 0
    for body in bodies:
        print("\n".join(_scope_lines(body)))
    if agents is not None:
        print(f"agents today ({agents['bucket']}):")
        print("\n".join(f"  {s['scope'].removeprefix('agent:'):<16} {_spend(s)}"
                        for s in agents["scopes"]) or "  none yet")
    if unpriced:
        print(unknown_models_line(unpriced))
    return 0


def _set(a: argparse.Namespace) -> int:
    if a.usd is None and a.tokens is None:
        print("fermix: a budget needs --usd, --tokens or both", file=sys.stderr)
        return 2
    body = {"scope": a.scope, "period": a.period, "usd": a.usd, "tokens": a.tokens}
    status = gateway_json(_settings(), "PUT", "/v1/budgets", "budget", payload=body)
    output.done(a, f"Budget set: {budget_line(status)}.", status)
    return 0


def _list(a: argparse.Namespace) -> int:
    body = gateway_json(_settings(), "GET", "/v1/budgets", "budgets request")
    if a.json:
        output.print_json(body)
        return 0
    if body["budgets"] and (console := output.terminal()) is not None:
        output.table(console, ("SCOPE", "PERIOD", "SPENT OF LIMIT", "USED", "RESETS"),
                     [_budget_row(b) for b in body["budgets"]])
        return 0
    print("\n".join(budget_line(b) for b in body["budgets"]) or "No budgets set.")
    return 0


def _rm(a: argparse.Namespace) -> int:
    body = gateway_json(_settings(), "DELETE", "/v1/budgets", "budget removal",
                        params={"scope": a.scope, "period": a.period})
    output.done(a, f"Removed the {ADJECTIVE[a.period]} budget on {a.scope}.", body)
    return 0


# The gateway's own sentence for a refusal (no such budget, a bad value): exit 1.
_guarded = refusals_as_exit_1(404, 422)


def _usd(text: str) -> float:
    try:
        value = float(text.removeprefix("$"))
    except ValueError:
        value = -1.0
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive amount of USD, not {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``usage`` and ``budget`` on the ``fermix`` parser."""
    u = sub.add_parser("usage", help="what model calls cost, per agent, conversation, user")
    u.add_argument("--agent", action="append", default=[], type=_scope_arg("agent:"),
                   metavar="A", help="an agent's spending (repeatable)")
    u.add_argument("--conversation", action="append", default=[],
                   type=_scope_arg("conversation:"), metavar="C",
                   help="a conversation's: CHANNEL:CHAT or CHANNEL|CHAT|THREAD")
    u.add_argument("--user", action="append", default=[], type=_scope_arg("user:"),
                   metavar="U", help="a user's: CHANNEL:ID (on HTTP, http:CHAT)")
    u.add_argument("--by", choices=(*PERIODS, "kind"),
                   help="a series of hours, days or months (UTC), or the split by kind of call")
    u.add_argument("--last", type=positive_int, metavar="N",
                   help="buckets in the series (default 24 hours, 30 days, 12 months)")
    u.add_argument("--json", action="store_true", help="print the raw JSON")
    u.set_defaults(func=_guarded(_usage))

    b = sub.add_parser("budget", help="limits in USD or tokens on a scope and period")
    cmds = b.add_subparsers(dest="budget_command", required=True)
    scope_help = "total, agent:NAME, conversation:CHANNEL:CHAT or user:CHANNEL:ID"
    st = cmds.add_parser("set", help="set (or replace) a limit")
    st.add_argument("--scope", required=True, type=_scope_arg(""), help=scope_help)
    st.add_argument("--period", required=True, choices=PERIODS)
    st.add_argument("--usd", type=_usd, help="limit in USD")
    st.add_argument("--tokens", type=positive_int, help="limit in tokens (input + output)")
    output.add_json_flag(st, "print the gateway's JSON")
    st.set_defaults(func=_guarded(_set))
    ls = cmds.add_parser("list", help="every budget against what its scope spent")
    ls.add_argument("--json", action="store_true", help="print the raw JSON")
    ls.set_defaults(func=_guarded(_list))
    rm = cmds.add_parser("rm", help="remove a limit")
    rm.add_argument("--scope", required=True, type=_scope_arg(""), help=scope_help)
    rm.add_argument("--period", required=True, choices=PERIODS)
    output.add_json_flag(rm, "print the gateway's JSON")
    rm.set_defaults(func=_guarded(_rm))


