"""``fermix agent --local -m TEXT [--chat ID]``: one turn in this process, without a gateway or a
worker (the seed's local agent command path), through the same queue as a worker.

- **Redis**: ``FERMIX_REDIS_URL`` when it is set, and then it must answer (exit 1 otherwise: a
  configured Redis is never swapped for another, which would split the conversation's
  history). Unset, the embedded Redis of ``fermix dev`` under ``$FERMIX_HOME/dev/redis``: a
  running ``fermix dev``'s, else one started for this command and stopped after it
  (:mod:`fermix_dev.embedded`).
- **Model**: the configured provider; with no provider key, the built-in scripted model served
  from this process, said on stderr.
- **Queue**: the message is accepted into the conversation's inbox as the gateway accepts one
  (queue mode, limits, commands, the trust audit), and this process then dispatches the
  conversation as a worker does (:class:`~fermix_worker.turn.dispatch.Dispatcher` over the
  worker's own :attr:`~fermix_worker.runtime.Runtime.turn_runner`): the atomic claim takes the inbox
  head under a lease, so a local turn never runs beside a worker's turn in the same chat, and
  messages queued before it are answered first, in order. While a worker holds the chat, this
  process waits for its run to end, answered by whoever takes it. It beats as worker
  ``local-PID@HOST`` meanwhile, so no reaper takes its turn for a dead worker's.
- **Output**: the run's tool calls on stderr as they happen (fermix_cli/tool_events.py);
  ``--json``: the run's record and its tool calls as one JSON document instead of the reply.
- **Exit**: 0 with the reply on stdout; 1 with one sentence when the run ends ``error`` or
  ``stopped``, is held for a paused agent, or is not over within ``--timeout`` seconds of
  waiting for others (a turn this process runs ends by its own deadline,
  ``FERMIX_TURN_TIMEOUT``); 2 for a configuration or input mistake.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from fermix_cli.client import ClientError
from fermix_cli.tool_events import ToolLines, follow
from fermix_dev import embedded
from fermix_shared.agents.definitions import agent_named, agent_names, bound_agent
from fermix_shared.channels.modes import queue_mode_for
from fermix_shared.errors import ConfigError

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

    from fermix_gateway.commands import Command, Outcome
    from fermix_shared.models import ConversationKey, InboundMessage, RunRecord
    from fermix_shared.settings import Settings

    # The gateway's way of starting a Celery task by name, and work done on its side.
    Send = Callable[[str, list[str]], Awaitable[None]]
    GatewayWork = Callable[[aioredis.Redis, Send], Awaitable[Outcome]]

PREFIX = "[fermix agent --local]"
# How often a busy conversation is tried again (the claim is one Lua call).
RETRY_S = 0.25


def _note(err: TextIO, text: str) -> None:
    err.write(f"{PREFIX} {text}\n")
    err.flush()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does


def run_local(message: str, chat: str | None, timeout: float, agent: str | None = None,
              out: TextIO = sys.stdout, err: TextIO = sys.stderr, as_json: bool = False) -> int:
    """Run one turn here (see the module docstring); returns the exit code."""
    home = embedded.fermix_home()
    redis_server: embedded.EmbeddedRedis | None = None
    llm = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        # A configured Redis: a URL, or a master found through Sentinel.
        redis_url = embedded.configured_redis_url() or embedded.configured("redis_master")
        if redis_url is None:
            (home / "dev" / "logs").mkdir(parents=True, exist_ok=True)
            redis_server = embedded.acquire(home / "dev" / "redis", "local",
                                            log_path=home / "dev" / "logs" / "redis.log",
                                            on_wait=lambda text: _note(err, text))
            os.environ["FERMIX_REDIS_URL"] = redis_url = redis_server.url
            whose = "the running `fermix dev`'s" if redis_server.shared else "the embedded"
            _note(err, f"no FERMIX_REDIS_URL: using {whose} Redis in {redis_server.data_dir}")
        _ping()
        if embedded.needs_scripted_model(os.environ):
            from fermix_dev.scripted_llm import ScriptedLLMServer

            llm = ScriptedLLMServer().start()
            os.environ.update(embedded.scripted_model_env(llm.openai_base_url))
            _note(err, embedded.SCRIPTED_NOTICE)
        from fermix_shared.settings import get_settings

        get_settings.cache_clear()  # read with the variables set above
        settings = get_settings()
        from fermix_shared.redis.client import get_redis

        return LocalTurn(settings, get_redis(), out, err, as_json).run(message, chat, agent,
                                                                       timeout)
    finally:
        if llm is not None:
            llm.stop(timeout=1)
        if redis_server is not None:
            redis_server.release()
        signal.signal(signal.SIGTERM, previous)


def _ping() -> None:
    """A configured Redis must answer (within ~2 s, a person is waiting)."""
    import redis

    from fermix_shared.redis.client import client_for_settings
    from fermix_shared.redis.sentinel import describe, sentinel_target
    from fermix_shared.settings import Settings

    settings = Settings()
    where = (describe(settings) if sentinel_target(settings)
             else embedded.redact_url(settings.redis_url))
    client = client_for_settings(settings, max_connections=2, outage_s=0)
    try:
        client.ping()
    except redis.RedisError as e:
        raise ClientError(
            f"cannot reach Redis at {where} ({e}); start it, or unset "
            "FERMIX_REDIS_URL to use the embedded Redis under $FERMIX_HOME/dev/redis") from e
    finally:
        client.close()


class LocalTurn:
    """One message through accept, dispatch and the run's end, in this process."""

    def __init__(self, settings: Settings, r: redis.Redis, out: TextIO, err: TextIO,
                 as_json: bool = False):
        self._settings, self._r, self._out, self._err = settings, r, out, err
        self._tools, self._as_json = ToolLines(err), as_json
        self.node = f"local-{os.getpid()}@{socket.gethostname()}"

    def run(self, text: str, chat: str | None, agent: str | None, timeout: float) -> int:
        from fermix_shared.models import ConversationKey, InboundMessage

        chat = chat or "default"
        if not ConversationKey.valid_part(chat):
            raise ConfigError(f"--chat: 1-200 characters without spaces or '|', not {chat!r}")
        limit = self._settings.limits.max_text_chars
        if len(text) > limit:
            raise ConfigError(f"the message has {len(text)} characters; at most {limit} are "
                              "accepted (FERMIX_LIMITS__MAX_TEXT_CHARS)")
        key = ConversationKey(channel="http", chat_id=chat)
        agent = agent or bound_agent(self._settings.bindings, key)
        self._check_agent(agent)
        self._audit_trust(key, text, agent)
        msg = InboundMessage(key=key, text=text, sender_id="cli", trust="operator", agent=agent)
        from fermix_gateway.commands import parse_command

        if cmd := parse_command(text):
            outcome = self._gateway_side(lambda ar, send: self._command(ar, send, key, cmd))
            if outcome.control == "compact":
                msg = InboundMessage(key=key, text="/compact", sender_id="cli", kind="compact",
                                     compact_reason="command", agent=agent)
            elif outcome.run_text is None:
                reply = outcome.reply or ""
                self._out.write(json.dumps({"status": "ok", "reply": reply, "tools": []},
                                           indent=2) + "\n" if self._as_json else reply + "\n")
                return 0
            else:
                msg = msg.model_copy(update={"text": outcome.run_text,
                                             "profile": outcome.profile})
        run_id = self._accept(msg)
        stop_showing = follow(self._r, run_id, self._tools)
        try:
            record = self._until_ended(msg.key.as_str(), run_id, timeout)
        finally:
            stop_showing()
        return self._report(record)

    def _check_agent(self, name: str) -> None:
        agent = agent_named(self._settings.agents, name)
        if agent is None:
            raise ConfigError(f"--agent: no agent named {name!r}; declared agents: "
                              f"{', '.join(agent_names(self._settings.agents))}")
        if agent.role != "main":
            raise ConfigError(f"--agent: {name!r} is a 'sub' agent (run through skill_run), "
                              "not one that answers chats")

    def _audit_trust(self, key: ConversationKey, text: str, agent: str) -> None:
        """The trust decision, audited as the gateway audits it: the person at this host's
        command line is an operator."""
        from fermix_shared import audit

        audit.record(self._r, "trust", "inbound", "pass", actor="http:cli", conv=key.as_str(),
                     agent=agent, trust="operator", text_sha256=audit.text_digest(text),
                     text_len=len(text))

    # -- the gateway's half: commands, queue mode, accept ---------------------------------

    def _gateway_side(self, work: GatewayWork) -> Outcome:
        """Run the gateway's own async code (commands, /stop for ``interrupt``) here."""
        from fermix_shared.celery_app import app
        from fermix_shared.redis.client import async_client_for_settings

        async def send(name: str, args: list[str]) -> None:
            app.send_task(name, args=args)

        async def go() -> Outcome:
            ar = async_client_for_settings(self._settings)
            try:
                return await work(ar, send)
            finally:
                await ar.aclose()

        return asyncio.run(go())

    async def _command(self, ar: aioredis.Redis, send: Send, key: ConversationKey,
                       cmd: Command) -> Outcome:
        from fermix_gateway import commands
        from fermix_shared.hooks import get_hooks

        return await commands.handle(ar, self._settings, key, cmd,
                                     commands.Caller("http:cli", "operator"), get_hooks(),
                                     send=send)

    def _accept(self, msg: InboundMessage) -> str:
        """Queue ``msg`` as the gateway's ``POST /v1/agent`` does; its run id."""
        from fermix_gateway.commands import Outcome, stop
        from fermix_shared.hooks import get_hooks
        from fermix_shared.stores import queue

        conv = msg.key.as_str()
        s = self._settings
        mode = "followup" if msg.kind != "message" else \
            queue_mode_for(s, msg.key.channel, queue.queue_mode(self._r, conv))
        if mode == "interrupt":
            async def interrupt(ar: aioredis.Redis, send: Send) -> Outcome:
                return Outcome(await stop(ar, msg.key, reason="interrupt", send=send,
                                          by="interrupt"))

            self._gateway_side(interrupt)
        limits = queue.AcceptLimits(sender=f"http:{msg.key.chat_id}",
                                    max_queued=s.limits.max_queued_per_conversation,
                                    per_minute=s.limits.sender_messages_per_minute)
        accepted = queue.accept(self._r, msg, mode=mode, limits=limits)
        match accepted.code:
            case queue.AcceptCode.refused:
                raise ClientError("a turn is already running or queued in this conversation "
                                  "(queue mode 'reject'); try again when it has finished")
            case queue.AcceptCode.full:
                raise ClientError(f"{s.limits.max_queued_per_conversation} messages are already "
                                  "waiting in this conversation; try again once they are answered")
            case queue.AcceptCode.rate_limited:
                raise ClientError(f"this chat is past {s.limits.sender_messages_per_minute} "
                                  "messages a minute; try again in "
                                  f"{max(1, -(-accepted.retry_after_ms // 1000))} s")
        hooks = get_hooks()
        if accepted.new and hooks.has("message_received"):
            hooks.call("message_received", {
                "run_id": accepted.run_id, "channel": msg.key.channel, "chatId": msg.key.chat_id,
                "threadScope": msg.key.thread_scope, "text": msg.text,
            })
        return accepted.run_id

    # -- the worker's half: claim and run, or wait -----------------------------------------

    def _until_ended(self, conv: str, run_id: str, timeout: float) -> RunRecord:
        """Dispatch the conversation until ``run_id`` has ended (a turn queued before it runs
        first); wait while another process holds it."""
        from fermix_shared.scheduling.firing import kick_dispatch
        from fermix_shared.stores import runs
        from fermix_worker.fleet.heartbeat import Heartbeat
        from fermix_worker.runtime import Runtime, worker_name
        from fermix_worker.turn.dispatch import Dispatcher

        name = worker_name(self.node)
        heartbeat = Heartbeat(self._r, name, self.node, self._settings.worker_heartbeat_seconds)
        heartbeat.start()
        # What a worker's dispatch hands on (the next message) goes to the fleet, if any.
        dispatcher = Dispatcher(self._r, self._settings, Runtime.current().turn_runner, name,
                                kick_dispatch)
        deadline = time.monotonic() + timeout if timeout > 0 else None
        told = False
        try:
            while True:
                record = runs.get(self._r, run_id)
                if record is not None and record.status.terminal:
                    return record
                kind = dispatcher.dispatch(conv)
                if kind in ("claimed", "orphan"):
                    continue  # ran a turn: ours, or one queued before it
                if kind == "paused":
                    raise ClientError(f"the agent of this chat is paused: run {run_id} waits in "
                                      "the queue and runs once it is resumed (fermix agents "
                                      "resume NAME)")
                if deadline is not None and time.monotonic() >= deadline:
                    raise ClientError(f"no answer within {timeout:g} s; run {run_id} is still "
                                      "queued or running (a worker may finish it)")
                if not told:
                    _note(self._err, f"the chat is busy (another turn, or this one waiting for "
                                     f"subagents or an approval); run {run_id} waits for it")
                    told = True
                self._wait_for(run_id, deadline)
        finally:
            heartbeat.stop()
            heartbeat.mark_stopped()

    def _wait_for(self, run_id: str, deadline: float | None) -> None:
        """Until the run's next event or RETRY_S, whichever comes first (a conversation that
        frees up has no event of its own: the claim is tried again after RETRY_S)."""
        from fermix_shared import keys

        wait = RETRY_S if deadline is None else max(0.0, min(RETRY_S, deadline - time.monotonic()))
        self._r.xread({keys.run_events(run_id): "$"}, block=max(1, int(wait * 1000)))

    def _report(self, record: RunRecord) -> int:
        from fermix_gateway.api.schemas import run_json
        from fermix_shared.models import RunStatus

        if self._as_json:
            self._out.write(json.dumps({**run_json(record), "tools": self._tools.calls},
                                       indent=2) + "\n")
            self._out.flush()
            if record.status is RunStatus.ok:
                return 0
        elif record.status is RunStatus.ok:
            self._out.write((record.reply or "") + "\n")
            self._out.flush()
            return 0
        raise ClientError(f"run {record.run_id} ended {record.status}: "
                          f"{record.error or 'no reply'}")
