"""``fermix agents list | pause NAME | resume NAME | kill NAME``: the agents' lifecycle, through
the gateway (``FERMIX_GATEWAY_URL``, with ``FERMIX_API_TOKEN``), fleet-wide.

``list`` shows each agent's role, state (``created``, ``active``, ``idle``, ``paused``,
``killed``) and its active and pending counts. ``pause`` stops new turns of the agent (its
messages still queue; a running turn finishes); ``resume`` runs what queued, in order.
``kill`` stops it for good: its running turns and their subagents stop, and its messages are
refused with a reply until its definition is re-created. All are idempotent. An agent that is
not declared, a killed agent paused or resumed, or a gateway that cannot be reached or
refuses, exits 1 with a sentence. On a terminal ``list`` is a table; ``--json`` (on every
subcommand) prints the gateway's JSON.
"""

from __future__ import annotations

import argparse
import sys

from fermix_cli import output
from fermix_cli.client import gateway_json, refusals_as_exit_1
from fermix_cli.status import agents_table, format_agent
from fermix_shared.agents.definitions import AGENT_NAME_RE
from fermix_shared.settings import Settings, get_settings


def _settings() -> Settings:
    return get_settings()


def _named(a: argparse.Namespace) -> str | None:
    """The agent's name, or None (said on stderr) when it cannot be one."""
    if AGENT_NAME_RE.match(a.name):
        return str(a.name)
    print(f"fermix: no agent named {a.name!r} (agent names are 1-64 lowercase letters, "
          "digits, '-' or '_')", file=sys.stderr)
    return None


def _list(a: argparse.Namespace) -> int:
    body = gateway_json(_settings(), "GET", "/v1/agents", "agents request")
    if a.json:
        output.print_json(body)
    elif (console := output.terminal()) is not None:
        agents_table(console, body["agents"])
    else:
        for agent in body["agents"]:
            print(format_agent(agent))
    return 0


def _pause(a: argparse.Namespace) -> int:
    if (name := _named(a)) is None:
        return 1
    agent = gateway_json(_settings(), "POST", f"/v1/agents/{name}/pause", "pause")
    output.done(a, f"Agent {agent['name']} is paused: its messages queue ({agent['pending']} "
                f"pending) and run when you resume it (fermix agents resume {agent['name']}).",
                agent)
    return 0


def _resume(a: argparse.Namespace) -> int:
    if (name := _named(a)) is None:
        return 1
    agent = gateway_json(_settings(), "POST", f"/v1/agents/{name}/resume", "resume")
    released = agent["released"]
    output.done(a, f"Agent {agent['name']} is {agent['state']}: {released} conversation"
                f"{'' if released == 1 else 's'} released to run what queued.", agent)
    return 0


def _kill(a: argparse.Namespace) -> int:
    if (name := _named(a)) is None:
        return 1
    agent = gateway_json(_settings(), "POST", f"/v1/agents/{name}/kill", "kill")
    stopped = agent["stopped"]
    output.done(a, f"Agent {agent['name']} is killed: {stopped} running turn"
                f"{'' if stopped == 1 else 's'} stopped (with their subagents), and its "
                "messages are refused with a reply. It stays killed until its definition is "
                "re-created (declared again with a change).", agent)
    return 0


# The gateway's own sentence for a refusal (no such agent, a sub agent): exit 1.
_guarded = refusals_as_exit_1(404, 409)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``agents`` and its subcommands on the ``fermix`` parser."""
    agents = sub.add_parser("agents", help="the agents' lifecycle: list, pause, resume, kill")
    cmds = agents.add_subparsers(dest="agents_command", required=True)
    ls = cmds.add_parser("list", help="each agent's role, state and active/pending counts")
    ls.add_argument("--json", action="store_true", help="print the raw JSON")
    ls.set_defaults(func=_guarded(_list))
    pause = cmds.add_parser("pause", help="stop new turns of NAME; its messages queue")
    pause.add_argument("name", metavar="NAME")
    output.add_json_flag(pause, "print the gateway's JSON")
    pause.set_defaults(func=_guarded(_pause))
    resume = cmds.add_parser("resume", help="run what queued for NAME, in order")
    resume.add_argument("name", metavar="NAME")
    output.add_json_flag(resume, "print the gateway's JSON")
    resume.set_defaults(func=_guarded(_resume))
    kill = cmds.add_parser("kill", help="stop NAME for good: its running turns and subagents "
                                        "stop, its messages are refused")
    kill.add_argument("name", metavar="NAME")
    output.add_json_flag(kill, "print the gateway's JSON")
    kill.set_defaults(func=_guarded(_kill))
