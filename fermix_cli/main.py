"""The ``fermix`` command. Server commands exec the real programs (uvicorn, celery); client
commands talk to the gateway over HTTP. Errors are one sentence and a non-zero exit code."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import sys
from collections.abc import Sequence

from fermix_cli import completion
from fermix_cli.worker import CELERY_APP
from fermix_cli.worker import add_arguments as add_worker_arguments
from fermix_shared.errors import ConfigError, FermixError


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1: addresses only this machine can reach."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # any other name may resolve to a public address
        return False


def require_token_off_loopback(host: str) -> None:
    """Secure by default: never serve the open operator API (``/v1/*`` without a bearer
    token) beyond this machine. Raises ConfigError (exit 2) before anything binds."""
    if is_loopback(host):
        return
    from fermix_shared.settings import get_settings

    if get_settings().api_token is None:
        raise ConfigError(
            f"refusing to serve the API on {host} without a token: set FERMIX_API_TOKEN "
            "(every /v1 request then needs it as a bearer token) or bind 127.0.0.1"
        )


# `fermix gateway --processes N`: more than this is a typo, not a machine.
MAX_GATEWAY_PROCESSES = 64
PROCESSES_ENV = "FERMIX_GATEWAY_PROCESSES"


def process_count(text: str) -> int:
    """Parse ``--processes`` / FERMIX_GATEWAY_PROCESSES: a whole number from 1 to 64."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_GATEWAY_PROCESSES:
        raise argparse.ArgumentTypeError(
            f"expected a number of gateway processes from 1 to {MAX_GATEWAY_PROCESSES}, not "
            f"{text!r} (from --processes or {PROCESSES_ENV})")
    return value


def _gateway(a: argparse.Namespace) -> int:
    import shutil
    import tempfile
    from pathlib import Path

    import uvicorn

    from fermix_gateway.app import LOG_LEVEL_ENV
    from fermix_shared import logs
    from fermix_shared.metrics import MULTIPROC_ENV
    from fermix_shared.settings import get_settings

    require_token_off_loopback(a.host)
    # Our root handler (FERMIX_LOG_FORMAT, secrets masked) writes uvicorn's lines too; each
    # process of a multi-process gateway installs it again (the app factory reads the level).
    logs.configure(a.log_level, get_settings())
    os.environ[LOG_LEVEL_ENV] = a.log_level
    if a.processes > 1:
        # One /metrics for all of them: each process writes its counters to files here and
        # whichever answers the scrape adds them up (prometheus-client's multiprocess mode).
        # Emptied at every start (stale files would count twice); one per port, since a
        # stopped gateway re-raises SIGTERM and leaves it behind.
        metrics_dir = Path(tempfile.gettempdir()) / f"fermix-gateway-{a.port}-metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(mode=0o700)
        os.environ[MULTIPROC_ENV] = str(metrics_dir)
    # uvloop when installed (a dependency on Linux); h11, not httptools, because h11 refuses
    # oversized request heads (16 KB) where httptools buffers any size.
    uvicorn.run("fermix_gateway.app:serve_app", factory=True, host=a.host, port=a.port,
                log_level=a.log_level.lower(), timeout_graceful_shutdown=5, http="h11",
                timeout_keep_alive=a.keep_alive, log_config=None, workers=a.processes)
    return 0


def _celery(args: list[str], env: dict[str, str] | None = None) -> int:
    from fermix_shared.settings import Settings

    Settings()  # a bad setting is one sentence here (main), not a traceback from Celery's
    argv = [sys.executable, "-m", "celery", "-A", CELERY_APP, *args]
    os.execve(sys.executable, argv, env or dict(os.environ))


def _worker(a: argparse.Namespace) -> int:
    from fermix_cli import worker
    from fermix_shared.settings import Settings

    Settings()  # a bad setting is one sentence here (main), not a traceback from Celery's

    return worker.run(a)  # execs Celery at the niceness asked for (fermix_cli/worker.py)


def _beat(a: argparse.Namespace) -> int:
    # RedBeat, riding out Redis outages (fermix_shared/scheduling/beat.py; named, not imported, here).
    return _celery(["beat", "-S", "fermix_shared.scheduling.beat:Scheduler", "-l", a.log_level])


def _dev(a: argparse.Namespace) -> int:
    from fermix_dev.dev import run_dev

    require_token_off_loopback(a.host)  # its gateway binds a.host
    return run_dev(a.host, a.port, a.concurrency, a.check)


def _agent(a: argparse.Namespace) -> int:
    if a.local:
        from fermix_cli.local import run_local

        return run_local(a.message, a.chat, a.timeout, agent=a.agent, as_json=a.json)
    from fermix_cli.client import run_agent
    from fermix_shared.settings import get_settings

    return run_agent(get_settings(), a.message, a.chat, a.timeout, agent=a.agent,
                     as_json=a.json)


def _status(a: argparse.Namespace) -> int:
    from fermix_cli.status import run

    return run(a)


def _telegram_set_webhook(a: argparse.Namespace) -> int:
    from fermix_cli import output
    from fermix_shared.channels.base import ChannelError
    from fermix_shared.channels.telegram import TelegramChannel
    from fermix_shared.redis.client import cli_redis
    from fermix_shared.settings import get_settings

    if not a.url.startswith("https://"):
        raise ConfigError(f"Telegram only delivers webhooks to https URLs, not {a.url!r}")
    channel = TelegramChannel(get_settings(), cli_redis())
    try:
        channel.set_webhook(a.url)
        me = channel.get_me()
    except ChannelError as e:
        print(f"fermix: Telegram refused the webhook: {e}", file=sys.stderr)
        return 1
    output.done(a, f"Webhook set to {a.url} for @{me.get('username')}.\n"
                   f"Set FERMIX_TELEGRAM_BOT_USERNAME={me.get('username')} on the gateway.",
                webhook=a.url, bot=me.get("username"))
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds (a number >= 0), not {text!r}")
    return value


# How long the gateway keeps an idle client connection open (seconds). Longer, with a margin,
# than httpx's keepalive_expiry (5 s: the CLI, the OpenAI SDK, most Python clients), so such a
# client always closes an idle connection first. With uvicorn's 5 s, the same as httpx's, a
# request sent on a connection idle for just under 5 s could meet the gateway's close while
# it was busy: a closed connection instead of an answer. A proxy or client that reuses idle
# connections longer (an AWS ALB 60 s, aiohttp 15 s) needs --keep-alive above that. Not longer
# by default: a client holding a huge pool (1,000 connections) spends more CPU the longer idle
# ones stay open (benchmarks/RESULTS.md, "Issue 25: long-poll capacity").
KEEP_ALIVE_S = 10
KEEP_ALIVE_ENV = "FERMIX_GATEWAY_KEEP_ALIVE"


def keep_alive_seconds(text: str) -> int:
    """Parse ``--keep-alive`` / FERMIX_GATEWAY_KEEP_ALIVE: whole seconds from 1 to 3600."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(
            f"expected whole seconds from 1 to 3600 for an idle connection, not {text!r} "
            f"(from --keep-alive or {KEEP_ALIVE_ENV})")
    return value


def build_parser(client_commands: bool = True) -> argparse.ArgumentParser:
    """The ``fermix`` parser; without ``client_commands``, the server commands and the few
    whose modules are cheap to import (:data:`SERVER_COMMANDS`)."""
    p = argparse.ArgumentParser(prog="fermix", description="Fermix distributed agent runtime")
    sub = p.add_subparsers(dest="command", required=True)
    _add_server_commands(sub)
    _add_chat_commands(sub)
    completion.add_parser(sub)
    if client_commands:
        _add_client_commands(sub)
    return p


def _add_server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``gateway``, ``worker``, ``beat`` and ``dev``."""
    g = sub.add_parser("gateway", help="run the HTTP gateway (uvicorn)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8080)
    g.add_argument("--log-level", default="INFO")
    g.add_argument("--processes", type=process_count, metavar="N",
                   default=os.environ.get(PROCESSES_ENV) or "1",
                   help="gateway processes sharing the port (default 1, or "
                        "FERMIX_GATEWAY_PROCESSES): more absorb bursts on a multi-core host")
    g.add_argument("--keep-alive", type=keep_alive_seconds, metavar="SECONDS",
                   default=os.environ.get(KEEP_ALIVE_ENV) or str(KEEP_ALIVE_S),
                   help=f"seconds an idle client connection stays open (default {KEEP_ALIVE_S}, "
                        f"or {KEEP_ALIVE_ENV}): keep it above your clients' and proxy's idle "
                        "timeouts")
    g.set_defaults(func=_gateway)

    w = sub.add_parser("worker", help="run a Celery worker that runs turns")
    add_worker_arguments(w)
    w.set_defaults(func=_worker)

    b = sub.add_parser("beat", help="run Celery beat with the RedBeat scheduler")
    b.add_argument("--log-level", default="INFO")
    b.set_defaults(func=_beat)

    d = sub.add_parser("dev", help="everything on this machine with embedded defaults")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=8080)
    d.add_argument("--concurrency", type=int, default=20)
    d.add_argument("--check", action="store_true", help="start, run one turn, stop")
    d.set_defaults(func=_dev)


def _add_chat_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``agent`` (one message, its reply streamed), ``status`` and ``telegram set-webhook``."""
    ag = sub.add_parser("agent", help="send one message through the gateway, stream the reply")
    ag.add_argument("-m", "--message", required=True)
    ag.add_argument("--chat", default=None, help="chat id (default: 'default')")
    ag.add_argument("--agent", default=None,
                    help="the agent to answer (default: the bindings', else 'default')")
    ag.add_argument("--timeout", type=_seconds, default=600.0, metavar="S",
                    help="give up waiting after S seconds in all, 0 = never (default 600); "
                         "the run itself goes on")
    ag.add_argument("--local", action="store_true",
                    help="run the turn in this process, no gateway or worker: against "
                         "FERMIX_REDIS_URL, else the embedded Redis (fermix_cli/local.py)")
    ag.add_argument("--json", action="store_true",
                    help="print the run (status, reply, tool calls) as JSON at its end")
    ag.set_defaults(func=_agent)

    st = sub.add_parser("status", help="queue activity, workers seen, provider, skills and agents, "
                                       "from the gateway")
    st.add_argument("--json", action="store_true", help="print the raw JSON")
    st.set_defaults(func=_status)
    tg = sub.add_parser("telegram", help="Telegram bot setup").add_subparsers(
        dest="telegram_command", required=True)
    hook = tg.add_parser("set-webhook", help="register URL/webhooks/telegram with the secret")
    hook.add_argument("url", help="the public https URL of POST /webhooks/telegram")
    hook.add_argument("--json", action="store_true", help="print what changed as JSON")
    hook.set_defaults(func=_telegram_set_webhook)


# Server commands are parsed without the client commands' modules, which are slow to import
# (httpx, settings, stores: ~1 s of CPU): `fermix dev` starts its processes that much sooner.
SERVER_COMMANDS = frozenset({"dev", "worker", "gateway", "beat"})


def _add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fermix_cli.agents import add_parser as add_agents_parser
    from fermix_cli.audit import add_parser as add_audit_parser
    from fermix_cli.doctor import add_parser as add_doctor_parser
    from fermix_cli.evals import add_parser as add_eval_parser
    from fermix_cli.replay import add_parser as add_replay_parser
    from fermix_cli.schedule import add_parser as add_schedule_parser
    from fermix_cli.skills import add_parser as add_skills_parser
    from fermix_cli.tokens import add_parser as add_tokens_parser
    from fermix_cli.usage import add_parser as add_usage_parser

    add_schedule_parser(sub)
    add_skills_parser(sub)
    add_agents_parser(sub)
    add_audit_parser(sub)
    add_usage_parser(sub)
    add_tokens_parser(sub)
    add_replay_parser(sub)
    add_eval_parser(sub)
    add_doctor_parser(sub)


def _client_error(e: FermixError) -> bool:
    """A ClientError (exit 1): only raised once ``fermix_cli.client`` was imported."""
    client = sys.modules.get("fermix_cli.client")
    return client is not None and isinstance(e, client.ClientError)


def main(argv: Sequence[str] | None = None) -> None:
    completion.complete(build_parser)  # a shell asking what completes its line: answer, exit
    argv = list(sys.argv[1:] if argv is None else argv)
    server = bool(argv) and argv[0] in SERVER_COMMANDS
    args = build_parser(client_commands=not server).parse_args(argv)
    try:
        code = args.func(args)
    except FermixError as e:
        print(f"fermix: {e}", file=sys.stderr)
        code = 1 if _client_error(e) else 2
    except KeyboardInterrupt:
        code = 130
    except Exception as e:
        if (reason := settings_invalid(e)) is None:
            raise
        print(f"fermix: {reason}", file=sys.stderr)
        code = 2
    sys.exit(code)


def settings_invalid(e: Exception) -> str | None:
    """The sentence for settings that do not validate (a bad value in the environment or the
    TOML file: each field and its reason), or None for any other exception."""
    from pydantic import ValidationError

    from fermix_shared.settings import Settings
    from fermix_shared.settings_check import invalid

    if not (isinstance(e, ValidationError) and e.title == Settings.__name__):
        return None
    return (f"the settings do not validate: {invalid(e)} (correct them in the file "
            "FERMIX_CONFIG names, or their FERMIX_* variables; `fermix doctor` checks them)")


if __name__ == "__main__":
    main()
