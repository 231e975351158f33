"""``fermix replay RUN [--step N]`` and ``fermix fork RUN [--step N] [--model M | --agent A |
--prompt FILE] [--live-tools]``: a recorded run replayed exactly, or continued from a step on
another model, agent or prompt, through the gateway (``POST /v1/runs/{id}/replay`` and
``/fork``; a worker does the work).

``replay`` exits 0 when the run reproduces (same tool calls, same reply, byte for byte), 1 with
the first step that diverges and both sides of it; ``--step N`` stops after step N and shows
what it sent and got. ``fork`` prints the original and the fork side by side (reply, tool
calls, tokens, cost). On a terminal both are tables, the verdict coloured; piped, the plain
lines. ``--json`` prints the gateway's report. A run without a record, a bad
step or agent, or a gateway that cannot be reached exits 1 with a sentence.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from fermix_cli import output
from fermix_cli.client import gateway_json, refusals_as_exit_1
from fermix_shared.settings import get_settings

# What the CLI waits for: a little longer than the gateway waits for its worker.
REPLAY_TIMEOUT_S = 70
FORK_TIMEOUT_S = 310


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number (1 or more)")
    return n


def _short(text: str | None, width: int = 70) -> str:
    if text is None:
        return "—"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def _line(text: str) -> str:
    """An excerpt on one line (its line breaks shown as ``\\n``)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _replay_heading(body: dict[str, Any]) -> str:
    return (f"Replay of {body['runId']}: {body['recordedSteps']} steps recorded; no model "
            "called, no tool run, nothing delivered.")


def format_replay(body: dict[str, Any]) -> str:
    """The replay's report, as plain lines."""
    lines = [_replay_heading(body)]
    for s in body["steps"]:
        lines.append(f"  {s['step']:>3}  {s['kind']:<5}  {s['summary']}")
    return "\n".join(lines + _replay_verdict(body))


def _replay_verdict(body: dict[str, Any]) -> list[str]:
    """After the steps: where it diverged, or that it reproduced (and a step's detail)."""
    lines = []
    d = body.get("divergence")
    if d is not None:
        lines.append(f"Diverged at step {d['step']} ({d['kind']}): {d['what']}.")
        if d.get("recorded") or d.get("now"):
            lines.append(f"  recorded: {_line(d['recorded'])}")
            lines.append(f"  now:      {_line(d['now'])}")
    elif body.get("stoppedAfter"):
        lines.append(f"Steps 1–{body['stoppedAfter']} reproduce.")
    elif body["reproduced"]:
        reply = body["reply"] or ""
        lines.append(f"Reproduced: the same tool calls and the same reply ({len(reply.encode())} "
                     f"bytes, sha256 {body['replySha256']}).")
    if body.get("cut"):
        lines.append("The record was cut at [recorder] max_bytes: only the steps before the "
                     "cut were recorded.")
    if (detail := body.get("detail")) is not None:
        lines.append(json.dumps(detail, indent=2, ensure_ascii=False))
    return lines


def _print_replay(body: dict[str, Any]) -> None:
    if (console := output.terminal()) is None:
        print(format_replay(body))
        return
    output.table(console, ("STEP", "KIND", "SUMMARY"),
                 [[str(s["step"]), s["kind"], s["summary"]] for s in body["steps"]],
                 title=_replay_heading(body), numbers=("STEP",))
    style = "red" if body.get("divergence") else "green" if body["reproduced"] else ""
    for i, line in enumerate(_replay_verdict(body)):
        console.print(output.Text(line, style=f"bold {style}".strip() if i == 0 else ""))


def _calls(side: dict[str, Any]) -> str:
    calls = side["toolCalls"]
    if not calls:
        return "none"
    return "; ".join(f"{c['name']} {json.dumps(c['arguments'], ensure_ascii=False)}"
                     for c in calls)


def _fork_rows(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    o, f = body["original"], body["fork"]
    return [
        ("", o["label"], f"fork: {f['label']}"),
        ("run", o["runId"], f["runId"]),
        ("status", o["status"], f["status"]),
        ("models", ", ".join(dict.fromkeys(o["models"])) or "—",
         ", ".join(dict.fromkeys(f["models"])) or "—"),
        ("tool calls", _short(_calls(o), 40), _short(_calls(f), 40)),
        ("tokens in/out", f"{o['inputTokens']}/{o['outputTokens']}",
         f"{f['inputTokens']}/{f['outputTokens']}"),
        ("cost", f"${o['usd']:.6f}", f"${f['usd']:.6f}"),
    ]


def format_fork(body: dict[str, Any]) -> str:
    """The original and the fork, side by side, as plain lines."""
    o, f = body["original"], body["fork"]
    out = [f"{a:<14} {b:<42} {c}" for a, b, c in _fork_rows(body)]
    out.append("reply (original):")
    out += textwrap.wrap(o["reply"] or "—", 96, initial_indent="  ", subsequent_indent="  ")
    out.append("reply (fork):")
    out += textwrap.wrap(f["reply"] or "—", 96, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(out)


def _replay(a: argparse.Namespace) -> int:
    payload = {"step": a.step} if a.step else {}
    body = gateway_json(get_settings(), "POST", f"/v1/runs/{a.run}/replay", "replay request",
                        payload=payload, timeout=REPLAY_TIMEOUT_S)
    if a.json:
        print(json.dumps(body, indent=2, ensure_ascii=False))
    else:
        _print_replay(body)
    return 0 if body["reproduced"] else 1


def _fork(a: argparse.Namespace) -> int:
    prompt = None
    if a.prompt is not None:
        try:
            prompt = Path(a.prompt).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            print(f"fermix: cannot read the prompt file {a.prompt}: {e}", file=sys.stderr)
            return 2
    if a.model is None and a.agent is None and prompt is None:
        print("fermix: a fork needs --model, --agent or --prompt", file=sys.stderr)
        return 2
    payload = {"step": a.step or 1, "model": a.model, "agent": a.agent, "prompt": prompt,
               "liveTools": a.live_tools}
    body = gateway_json(get_settings(), "POST", f"/v1/runs/{a.run}/fork", "fork request",
                        payload=payload, timeout=FORK_TIMEOUT_S)
    if a.json:
        print(json.dumps(body, indent=2, ensure_ascii=False))
    elif (console := output.terminal()) is not None:
        head, *rows = _fork_rows(body)
        output.table(console, head, [[what, output.state(o) if what == "status" else o,
                                      output.state(f) if what == "status" else f]
                                     for what, o, f in rows])
        for side, key in (("original", "original"), ("fork", "fork")):
            console.print(output.Text(f"reply ({side}):", style="bold"))
            console.print(output.Text(body[key]["reply"] or "—"), soft_wrap=False)
    else:
        print(format_fork(body))
    return 0


# The gateway's own sentence (no record, a bad step or agent, no worker): exit 1.
_guarded = refusals_as_exit_1(403, 404, 409, 422, 504)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``replay`` and ``fork`` on the ``fermix`` parser."""
    rp = sub.add_parser("replay", help="re-run a recorded turn exactly; show where it diverges")
    rp.add_argument("run", metavar="RUN", help="the run id")
    rp.add_argument("--step", type=_positive, help="stop after step N and show it")
    rp.add_argument("--json", action="store_true", help="print the raw JSON")
    rp.set_defaults(func=_guarded(_replay))
    fk = sub.add_parser("fork", help="continue a recorded turn on another model, agent or "
                                     "prompt; compare")
    fk.add_argument("run", metavar="RUN", help="the run id")
    fk.add_argument("--step", type=_positive, help="the first step to run anew (default 1)")
    which = fk.add_mutually_exclusive_group()
    which.add_argument("--model", help="provider/model, or a model of the configured provider")
    which.add_argument("--agent", help="a declared agent")
    which.add_argument("--prompt", metavar="FILE", help="a file holding the new system prompt")
    fk.add_argument("--live-tools", action="store_true",
                    help="run tools for real (only those the caller may run)")
    fk.add_argument("--json", action="store_true", help="print the raw JSON")
    fk.set_defaults(func=_guarded(_fork))
