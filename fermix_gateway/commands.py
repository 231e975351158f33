"""Chat commands the gateway answers itself, at once, without queueing behind the active turn.

Channel-agnostic: the run API and the chat webhooks share them. A command either answers
(``reply``) or turns into a run to queue (``/ultra <prompt>``). Every command that is carried
out is first heard by the command hooks (``command`` and ``command:<name>``, Fased's command
events); ``/new`` (aliases ``/reset``, the seed's, and ``/clear``) ends the conversation's
session (``session_end``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from fermix_gateway import approval_answers
from fermix_gateway.approval_answers import SendTask
from fermix_shared import audit, keys
from fermix_shared.agents.definitions import bound_agent
from fermix_shared.channels.modes import queue_mode_for
from fermix_shared.hooks import HookRegistry, command_hook
from fermix_shared.models import ConversationKey, RunProfile, RunRecord, RunStatus, now
from fermix_shared.run_events import ClearedRunStopped, CompactionCancelled
from fermix_shared.settings import Settings
from fermix_shared.stores import events, queue, runs, sessions
from fermix_shared.usage import budgets
from fermix_shared.usage import store as usage_store
from fermix_shared.usage.scopes import TOTAL, agent_scope, conversation_scope, user_scope
from fermix_shared.usage.store import BucketRef

HELP = {
    "new": "start a fresh conversation (long-term memory is kept); aliases /reset, /clear",
    "compact": "summarize this conversation to free room (owner only)",
    "stop": "stop the running request and clear queued messages",
    "ultra": "run a prompt in exhaustive multi-agent mode (owner only)",
    "status": "what is running and queued here",
    "queue": "show or set this conversation's queue mode (owner only)",
    "approve": "approve a tool call waiting for you: /approve ID (owner only)",
    "deny": "refuse a tool call waiting for you: /deny ID [reason] (owner only)",
    "usage": "what this conversation and its agent spent, and the budgets (owner only)",
    "whoami": "your id and trust level",
    "help": "this list",
}
COMMANDS = (*HELP, "reset", "clear")
OWNER_ONLY = frozenset({"ultra", "queue", "compact", "approve", "deny", "usage"})
OWNER_ONLY_MESSAGE = "Sorry, /{name} is only available to the owner."
# Commands that change a conversation, audited as ``admin`` entries (/queue only when it sets
# a mode, /ultra only with a prompt).
AUDITED = frozenset({"stop", "new", "reset", "clear", "compact", "queue", "ultra"})
ULTRA_USAGE = "Usage: /ultra <prompt>"


@dataclass(frozen=True)
class Command:
    name: str
    args: str


@dataclass(frozen=True)
class Caller:
    """Who sent the command: ``channel:user_id`` and the trust it maps to."""

    sender_id: str
    trust: str


@dataclass(frozen=True)
class Outcome:
    """A command's answer, or a run to queue instead (``/ultra``)."""

    reply: str | None = None
    run_text: str | None = None
    profile: RunProfile = "default"
    # A job for the conversation's worker, in its order ("compact"); it answers itself.
    control: Literal["compact"] | None = None


def parse_command(text: str, bot_name: str | None = None) -> Command | None:
    """``/name args`` (or ``/name@bot args``) for a known command, else None (also for a
    command addressed to another bot)."""
    text = text.strip()
    if not text.startswith("/"):
        return None
    head, _, args = text[1:].partition(" ")
    name, _, target = head.partition("@")
    if target and (not bot_name or target.lower() != bot_name.lower()):
        return None
    name = name.lower()
    return Command(name, args.strip()) if name in COMMANDS else None


async def end_runs_stopped(r: aioredis.Redis, run_ids: list[str], key: ConversationKey) -> None:
    """Runs whose messages were cleared before they ran end ``stopped``."""
    for run_id in run_ids:
        rec = await runs.get_async(r, run_id) or RunRecord(run_id=run_id, conversation=key)
        rec.status, rec.ended_at = RunStatus.stopped, now()
        await runs.put_async(r, rec)
        await events.emit_async(r, run_id, ClearedRunStopped(ended_at=rec.ended_at))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


async def after_stop(r: aioredis.Redis, key: ConversationKey, result: queue.StopResult,
                     send: SendTask | None, by: str) -> None:
    """The rest of a /stop or an interrupt (``result``): the cancelled turn's pending approval
    is cancelled and its turn resumed (``send``), and the cleared messages' runs end (a
    cleared post-turn compaction says so on the stream of the turn it followed)."""
    if result.active_run and send is not None:
        await approval_answers.cancel_pending(r, send, key.as_str(), by)
    await end_runs_stopped(r, [m.run_id for m in result.cleared], key)
    for m in result.cleared:
        if m.follows_run:
            await events.emit_async(r, m.follows_run,
                                    CompactionCancelled(reason=m.compact_reason or "auto"))


async def stop(r: aioredis.Redis, key: ConversationKey, reason: str = "stop",
               send: SendTask | None = None, by: str = "stop") -> str:
    """Cancel the active turn (its worker winds down, delivers nothing) and clear the queue.
    A turn parked on an approval has no worker to notice: its approval is cancelled and the
    turn resumed (``send``), so it ends ``stopped`` now."""
    result = await queue.stop_async(r, key.as_str(), reason)
    await after_stop(r, key, result, send, by)
    cleared = _plural(len(result.cleared), "queued message")
    if result.active_run:
        return f"Stopped the current request and cleared {cleared}."
    if result.cleared:
        return f"Nothing was running; cleared {cleared}."
    return "Nothing to stop."


async def set_queue_mode(r: aioredis.Redis, settings: Settings, key: ConversationKey, arg: str) -> str:
    conv = key.as_str()
    if not arg:
        own = await queue.queue_mode_async(r, conv)
        mode = queue_mode_for(settings, key.channel, own)
        return f"Queue mode for this conversation: {mode}" + ("" if own else " (default)") + "."
    arg = arg.lower()
    if arg not in queue.QUEUE_MODES:
        return f"Unknown queue mode {arg!r}. Choose one of: {', '.join(queue.QUEUE_MODES)}."
    await r.set(keys.queue_mode(conv), arg)
    return f"Queue mode set to {arg}."


async def conversation_status(r: aioredis.Redis, settings: Settings, key: ConversationKey) -> str:
    conv = key.as_str()
    running = await r.exists(keys.active(conv))
    waiting = await r.llen(keys.inbox(conv))
    mode = queue_mode_for(settings, key.channel, await queue.queue_mode_async(r, conv))
    state = "a request is running" if running else "nothing is running"
    return f"Here {state}; {_plural(waiting, 'message')} queued; queue mode {mode}."


async def usage_report(r: aioredis.Redis, settings: Settings, key: ConversationKey,
                       caller: Caller) -> str:
    """/usage: this conversation's and its agent's spending today and this month (UTC), and
    the budgets its turns are checked against."""
    when = time.time()
    agent = bound_agent(settings.bindings, key)
    here, theirs = conversation_scope(key.as_str()), agent_scope(agent)
    spent = await usage_store.totals_async(
        r, [BucketRef(s, p, when) for p in ("day", "month") for s in (here, theirs)])
    # On HTTP the chat stands for the user (fermix_shared/usage/scopes.py).
    user = f"http:{key.chat_id}" if key.channel == "http" else (
        f"console:{caller.sender_id.removeprefix('http:')}" if key.channel == "console"
        else caller.sender_id)
    found = await budgets.statuses_async(r, [TOTAL, theirs, here, user_scope(user)], when)
    lines = [
        f"Today (UTC): this conversation {budgets.spend_text(spent[0])}; "
        f"agent {agent} {budgets.spend_text(spent[1])}.",
        f"This month: this conversation {budgets.spend_text(spent[2])}; "
        f"agent {agent} {budgets.spend_text(spent[3])}.",
    ]
    if found:
        lines += ["Budgets:", *(f"• {line}" for line in budgets.summary(found))]
    else:
        lines.append("No budget applies here.")
    return "\n".join(lines)


async def new_session(r: aioredis.Redis, key: ConversationKey, command: str, by: str,
                      hooks: HookRegistry | None) -> str:
    """/new, /reset, /clear: the conversation's session ends (``session_end``, while its
    history is still there), then its history and measured size go; long-term memory stays.
    The next message starts another session."""
    conv = key.as_str()
    ended = await sessions.end_async(r, conv)
    if ended is not None and hooks is not None:
        await hooks.acall("session_end", {"conversation": conv, "session_id": ended, "by": by,
                                          "reason": command})
    await r.delete(keys.history(conv), keys.conv_usage(conv))
    return "Started a fresh conversation. Long-term memory is kept."


async def command_hooks(hooks: HookRegistry | None, key: ConversationKey, cmd: Command,
                        caller: Caller) -> None:
    """The command hooks, before ``cmd`` acts: ``command`` (every command), then its own."""
    if hooks is None:
        return
    payload = {"command": cmd.name, "args": cmd.args, "conversation": key.as_str(),
               "by": caller.sender_id, "trust": caller.trust}
    await hooks.acall("command", payload)
    if (own := command_hook(cmd.name)) is not None:
        await hooks.acall(own, payload)


def help_text() -> str:
    return "Commands:\n" + "\n".join(f"/{name} — {text}" for name, text in HELP.items())


def _changes_things(cmd: Command) -> bool:
    """Whether ``cmd`` (past the owner check) changes the conversation: an ``admin`` entry."""
    if cmd.name == "queue":
        return cmd.args.lower() in queue.QUEUE_MODES
    return cmd.name in AUDITED and (cmd.name != "ultra" or bool(cmd.args))


async def handle(
    r: aioredis.Redis, settings: Settings, key: ConversationKey, cmd: Command, caller: Caller,
    hooks: HookRegistry | None = None, send: SendTask | None = None,
) -> Outcome:
    """Answer ``cmd``. ``send`` sends a Celery task by name (approvals and /stop resume a
    parked turn through it)."""
    if cmd.name in OWNER_ONLY:  # a capability check: audited whether it passes or fails
        passed = caller.trust == "operator"
        await audit.arecord(r, "check", f"/{cmd.name}", "pass" if passed else "fail",
                            actor=caller.sender_id, conv=key.as_str(), check="owner_only",
                            trust=caller.trust)
        if not passed:
            return Outcome(OWNER_ONLY_MESSAGE.format(name=cmd.name))
    if _changes_things(cmd):
        await audit.arecord(r, "admin", f"/{cmd.name}", "ok", actor=caller.sender_id,
                            conv=key.as_str(), agent=bound_agent(settings.bindings, key),
                            args_sha256=audit.text_digest(cmd.args) if cmd.args else None)
    await command_hooks(hooks, key, cmd, caller)
    match cmd.name:
        case "stop":
            return Outcome(await stop(r, key, send=send, by=caller.sender_id))
        case "approve" | "deny":
            approval_id, _, reason = cmd.args.partition(" ")
            if not approval_id:
                return Outcome(await approval_answers.pending_text(r, key.as_str()))
            if send is None:
                return Outcome("Approvals cannot be answered here.")
            decision: approval_answers.Decision = "approved" if cmd.name == "approve" else "denied"
            return Outcome(await approval_answers.answer(
                r, send, approval_id, decision, caller.sender_id, reason.strip()))
        case "queue":
            return Outcome(await set_queue_mode(r, settings, key, cmd.args))
        case "new" | "reset" | "clear":
            return Outcome(await new_session(r, key, cmd.name, caller.sender_id, hooks))
        case "ultra":
            if not cmd.args:
                return Outcome(ULTRA_USAGE)
            return Outcome(run_text=cmd.args, profile="ultra")
        case "status":
            return Outcome(await conversation_status(r, settings, key))
        case "usage":
            return Outcome(await usage_report(r, settings, key, caller))
        case "whoami":
            return Outcome(f"You are {caller.sender_id} ({caller.trust}).")
        case "help":
            return Outcome(help_text())
        case "compact":
            return Outcome(control="compact")
    raise AssertionError(cmd.name)
