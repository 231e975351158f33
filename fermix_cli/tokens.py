"""``fermix tokens create --name ann --role operator | list | revoke NAME``: named API tokens,
through the gateway (``FERMIX_GATEWAY_URL``, with an admin token: ``FERMIX_API_TOKEN``).

``create`` prints the new token once, on its own line (only its hash is kept: a lost token is
revoked and made again); ``list`` shows each token's name, role, maker and the secret's last 4
characters; ``revoke`` stops one at once, on every gateway. Roles: ``viewer`` (read),
``operator`` (also approve and deny, stop a turn, pause and resume an agent, run a job now),
``admin`` (also budgets, kill, skills reload, tokens). A bad name or role exits 2; a name taken,
an unknown token, or a gateway that cannot be reached or refuses exits 1 with a sentence.
On a terminal ``list`` is a table; ``--json`` prints the gateway's JSON (``create --json``: the
token with its name and role; ``revoke --json``: the token revoked).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from fermix_cli import output
from fermix_cli.client import gateway_json, refusals_as_exit_1
from fermix_shared.access.tokens import ROLES, TokenRefused, check_name
from fermix_shared.settings import get_settings


def _name(text: str) -> str:
    try:
        return check_name(text)
    except TokenRefused as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _create(a: argparse.Namespace) -> int:
    body = gateway_json(get_settings(), "POST", "/v1/tokens", "token request",
                        payload={"name": a.name, "role": a.role})
    if a.json:
        output.print_json(body)
        return 0
    print(f"Token {body['name']} ({body['role']}) created; it is shown this once:",
          file=sys.stderr)
    print(body["token"])
    return 0


def _list(a: argparse.Namespace) -> int:
    body = gateway_json(get_settings(), "GET", "/v1/tokens", "token request")
    if a.json:
        output.print_json(body)
        return 0
    if body["tokens"] and (console := output.terminal()) is not None:
        output.table(console, ("TOKEN", "ROLE", "HINT", "MADE", "BY"),
                     [(t["name"], t["role"], t["hint"], _made(t), t["createdBy"])
                      for t in body["tokens"]])
        return 0
    for t in body["tokens"]:
        print(f"{t['name']:<20} {t['role']:<9} {t['hint']}  made {_made(t)} by {t['createdBy']}")
    if not body["tokens"]:
        print("no named tokens (FERMIX_API_TOKEN is the admin token)")
    return 0


def _made(t: dict[str, Any]) -> str:
    return datetime.fromtimestamp(t["createdAt"] / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _revoke(a: argparse.Namespace) -> int:
    body = gateway_json(get_settings(), "DELETE", f"/v1/tokens/{a.name}", "token request")
    t = body["revoked"]
    output.done(a, f"Token {t['name']} ({t['role']}) revoked: it no longer works on any "
                "gateway.", body)
    return 0


# The gateway's own sentence for a refusal (a name taken, an unknown token): exit 1.
_guarded = refusals_as_exit_1(404, 409, 422)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tokens`` and its subcommands on the ``fermix`` parser."""
    tokens = sub.add_parser("tokens", help="named API tokens with roles: create, list, revoke")
    cmds = tokens.add_subparsers(dest="tokens_command", required=True)
    create = cmds.add_parser("create", help="make a token; prints it once")
    create.add_argument("--name", required=True, type=_name)
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--json", action="store_true", help="print the token and its name and "
                                                            "role as JSON")
    create.set_defaults(func=_guarded(_create))
    ls = cmds.add_parser("list", help="each token's name, role and maker")
    ls.add_argument("--json", action="store_true", help="print the raw JSON")
    ls.set_defaults(func=_guarded(_list))
    revoke = cmds.add_parser("revoke", help="stop the token NAME at once")
    revoke.add_argument("name", metavar="NAME", type=_name)
    output.add_json_flag(revoke, "print the gateway's JSON")
    revoke.set_defaults(func=_guarded(_revoke))
