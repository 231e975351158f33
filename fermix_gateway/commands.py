"""Chat commands the gateway answers itself, at once, without queueing behind the active turn.

Channel-agnostic: the run API and the chat webhooks share them. Each returns the reply text.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.models import ConversationKey, RunRecord, RunStatus, now
from fermix_shared.settings import Settings
from fermix_shared.stores import events, queue, runs

COMMANDS = ("stop", "queue", "new", "clear")


@dataclass(frozen=True)
class Command:
    name: str
    args: str


def parse_command(text: str, bot_name: str | None = None) -> Command | None:
    """``/name args`` (or ``/name@bot args``) for a known command, else None."""
    text = text.strip()
    if not text.startswith("/"):
        return None
    head, _, args = text[1:].partition(" ")
    name, _, target = head.partition("@")
    if target and bot_name and target.lower() != bot_name.lower():
        return None
    name = name.lower()
    return Command(name, args.strip()) if name in COMMANDS else None


async def end_runs_stopped(r: aioredis.Redis, run_ids: list[str], key: ConversationKey) -> None:
    """Runs whose messages were cleared before they ran end ``stopped``."""
    for run_id in run_ids:
        rec = await runs.get_async(r, run_id) or RunRecord(run_id=run_id, conversation=key)
        rec.status, rec.ended_at = RunStatus.stopped, now()
        await runs.put_async(r, rec)
        await events.emit_async(r, run_id, "lifecycle", phase="end", status="stopped",
                                endedAt=rec.ended_at)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


async def stop(r: aioredis.Redis, key: ConversationKey, reason: str = "stop") -> str:
    """Cancel the active turn (its worker winds down, delivers nothing) and clear the queue."""
    result = await queue.stop_async(r, key.as_str(), reason)
    await end_runs_stopped(r, [m.run_id for m in result.cleared], key)
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
        mode = settings.queue_mode_for(key.channel, own)
        return f"Queue mode for this conversation: {mode}" + ("" if own else " (default)") + "."
    arg = arg.lower()
    if arg not in queue.QUEUE_MODES:
        return f"Unknown queue mode {arg!r}. Choose one of: {', '.join(queue.QUEUE_MODES)}."
    await r.set(keys.queue_mode(conv), arg)
    return f"Queue mode set to {arg}."


async def handle(r: aioredis.Redis, settings: Settings, key: ConversationKey, cmd: Command) -> str:
    match cmd.name:
        case "stop":
            return await stop(r, key)
        case "queue":
            return await set_queue_mode(r, settings, key, cmd.args)
        case "new" | "clear":
            await r.delete(keys.history(key.as_str()))
            return "Started a fresh conversation. Long-term memory is kept."
    raise AssertionError(cmd.name)
