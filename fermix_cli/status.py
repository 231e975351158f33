"""``fermix status``: the gateway's view of the fleet (``GET /v1/status``): workers seen, the
queue, the provider route, memory, skills, agents and conversations. Piped, readable lines
(what scripts read); on a terminal, the lists are tables; ``--json`` prints the gateway's
JSON."""

from __future__ import annotations

import argparse
from typing import Any

from fermix_cli import output
from fermix_cli.client import get_status


def format_agent(a: dict[str, Any]) -> str:
    """One agent as ``fermix status`` and ``fermix agents list`` print it."""
    model = f", model {a['model']}" if a.get("model") else ""
    return (f"{a['name']} ({a['role']}{model}): {a['state']}, {a['active']} active, "
            f"{a['pending']} pending")


def format_memory(memory: dict[str, Any]) -> str:
    """The memory configuration line of ``fermix status``."""
    files = memory["files"]
    ranking = (f"embeddings ({memory['embeddingModel']})" if memory["ranking"] == "embeddings"
               else memory["ranking"])
    return (
        f"memory: {memory['activeFacts']} of {memory['maxActiveFacts']} facts, the top "
        f"{memory['recallTop']} by {ranking} in each prompt; {len(files)} prompt memory "
        f"file{'' if len(files) == 1 else 's'} in {memory['filesDir']}; review after "
        f"{memory['reviewQuietSeconds']:g} s quiet or {memory['reviewBatchTurns']} turns"
    )


def _summary(status: dict[str, Any]) -> list[str]:
    """The lines above the lists: workers, queue, provider route, memory."""
    workers = ", ".join(f"{w['name']} {w['lastSeenAgo']:.0f}s ago" for w in status["workers"])
    lines = [
        f"workers seen: {status['workersSeen']}" + (f" ({workers})" if workers else ""),
        f"active conversations: {status['activeConversations']}, "
        f"pending conversations: {status['pendingConversations']}, "
        f"active requests: {status['activeRequests']}, "
        f"pending requests: {status['pendingRequests']}",
        f"primary provider: {status['primary_provider']} (model {status['model']}), "
        f"fallback providers: {', '.join(status['fallback_providers']) or 'none'}",
    ]
    if memory := status.get("memory"):
        lines.append(format_memory(memory))
    return lines


def _skills_heading(status: dict[str, Any]) -> str:
    return (f"available skills: {len(status['available_skills'])}"
            + (f", {len(status['skillIssues'])} not loaded (fermix skills list)"
               if status["skillIssues"] else ""))


def _conversation_state(c: dict[str, Any]) -> str:
    return f"active, lease expires in {c['leaseExpiresIn']:.0f}s" if c["active"] else "idle"


def format_status(status: dict[str, Any]) -> str:
    """A few readable lines for ``fermix status`` (piped: what scripts read)."""
    lines = _summary(status)
    if "available_skills" in status:  # absent from gateways older than this client
        lines.append(_skills_heading(status))
        lines += [f"  {s['name']} ({s['trust']}): {s['description']}"
                  for s in status["available_skills"]]
    if "agents" in status:  # absent from gateways older than this client
        lines.append(f"agents: {len(status['agents'])}")
        lines += [f"  {format_agent(a)}" for a in status["agents"]]
    lines += [f"  {c['conversation']}: {_conversation_state(c)}, {c['pending']} pending"
              for c in status["conversations"]]
    return "\n".join(lines)


def agents_table(console: output.Console, agents: list[dict[str, Any]],
                 title: str | None = None) -> None:
    """The agents as a table (``fermix agents list`` and ``fermix status`` on a terminal)."""
    output.table(console, ("AGENT", "ROLE", "MODEL", "STATE", "ACTIVE", "PENDING"),
                 [(x["name"], x["role"], x.get("model") or "", output.state(x["state"]),
                   str(x["active"]), str(x["pending"])) for x in agents], title=title)


def _status_tables(console: output.Console, status: dict[str, Any]) -> None:
    for line in _summary(status):
        console.print(output.Text(line))
    if "available_skills" in status:
        output.table(console, ("SKILL", "TRUST", "DESCRIPTION"),
                     [(s["name"], s["trust"], s["description"])
                      for s in status["available_skills"]], title=_skills_heading(status))
    if "agents" in status:
        agents_table(console, status["agents"], title=f"agents: {len(status['agents'])}")
    if status["conversations"]:
        output.table(console, ("CONVERSATION", "STATE", "PENDING"),
                     [(c["conversation"], output.state(_conversation_state(c)),
                       str(c["pending"])) for c in status["conversations"]],
                     title="conversations")


def run(a: argparse.Namespace) -> int:
    """``fermix status [--json]``."""
    from fermix_shared.settings import get_settings

    status = get_status(get_settings())
    if a.json:
        output.print_json(status)
    elif (console := output.terminal()) is not None:
        _status_tables(console, status)
    else:
        print(format_status(status))
    return 0
