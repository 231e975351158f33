"""Plugin hooks: extension points in the agent loop and the gateway (the Fased hook points).

A plugin is a Python entry point in the ``fermix.hooks`` group that loads a module, an object
or a class (instantiated with no arguments). Its attributes named like a :data:`HookName` are
hooks, callables ``(payload: dict) -> dict | None`` (a name with a colon, the seed's internal
hooks ``agent:bootstrap`` and ``command:new``, is the attribute ``agent_bootstrap``,
``command_new``: see :func:`attribute_of`)::

    # pyproject.toml of the plugin
    [project.entry-points."fermix.hooks"]
    audit = "fermix_audit:plugin"

Several plugins may implement one hook; they run in entry-point name order. Every call has a
timeout (``Settings.hook_timeout_seconds``). A hook that raises or times out is logged (hook,
plugin and exception type; never the payload, which holds user text and may hold secrets) and
ignored: a plugin never breaks a turn.

*Observer* hooks get the payload and their return value is ignored. *Mutating* hooks may
return a dict whose keys (only those listed in :data:`MUTATIONS`, with the listed types) are
merged into the payload seen by the next plugin; :meth:`HookRegistry.call` returns the final
payload. A ``before_tool_call`` that returns ``{"block": reason}`` (``True``: a generic reason)
and a ``message_sending`` that returns ``{"cancel": True}`` are final: later plugins are not
called.

Each plugin gets a shallow copy of the payload; nested values (message lists, arguments) are
shared and must be treated as read-only. Under gevent a hook's thread is a greenlet, so the
timeout only interrupts the wait of a hook that yields (I/O, sleep); a timed-out hook keeps
running in the background and its result is discarded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, Literal, get_args

import anyio.to_thread

log = logging.getLogger(__name__)

# The command hooks (Fased's "command events"): ``command`` hears every chat command,
# ``command:<name>`` one (an alias has its own: ``/reset`` is ``command:reset``).
CommandHookName = Literal[
    "command:new", "command:reset", "command:clear", "command:stop", "command:compact",
    "command:status", "command:help", "command:whoami", "command:ultra", "command:queue",
    "command:approve", "command:deny", "command:usage",
]
HookName = Literal[
    "agent:bootstrap",
    "command",
    CommandHookName,
    "before_agent_start",
    "before_model_resolve",
    "before_prompt_build",
    "llm_input",
    "before_tool_call",
    "after_tool_call",
    "tool_result_persist",
    "agent_end",
    "before_compaction",
    "after_compaction",
    "message_received",
    "message_sending",
    "message_sent",
    "session_start",
    "session_end",
    "gateway_start",
    "gateway_stop",
]
HOOK_NAMES: tuple[HookName, ...] = get_args(HookName)

Payload = dict[str, Any]
Hook = Callable[[Payload], Payload | None]

# What each mutating hook may change: key -> accepted type. Other hooks are observers.
MUTATIONS: dict[HookName, dict[str, type | tuple[type, ...]]] = {
    # The prompt's bootstrap files, [{"name", "content"}, ...]: add, drop or change some.
    "agent:bootstrap": {"files": list},
    # Legacy (Fased): either phase's changes, before the explicit hooks have their say.
    "before_agent_start": {"provider": str, "model": str, "prependContext": str,
                           "systemPrompt": str},
    "before_model_resolve": {"provider": str, "model": str},
    "before_prompt_build": {"prependContext": str, "systemPrompt": str},
    "before_tool_call": {"block": (str, bool), "arguments": dict},
    "tool_result_persist": {"content": str},
    "message_sending": {"text": str, "cancel": bool},
}
# A mutation that ends the chain when its value is truthy.
_FINAL_KEYS = ("block", "cancel")

ENTRY_POINT_GROUP = "fermix.hooks"
DEFAULT_TIMEOUT = 5.0


class HookRegistry:
    """The hooks of every plugin, by hook point, in call order."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._hooks: dict[HookName, list[tuple[str, Hook]]] = {}

    @classmethod
    def from_entry_points(
        cls, group: str = ENTRY_POINT_GROUP, timeout: float = DEFAULT_TIMEOUT
    ) -> HookRegistry:
        """Load every plugin of ``group``, in name order; one that fails to load is logged."""
        registry = cls(timeout)
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            try:
                plugin = ep.load()
                if isinstance(plugin, type):
                    plugin = plugin()
            except Exception as e:
                log.error("hook plugin %s (%s) failed to load: %s: %s",
                          ep.name, ep.value, type(e).__name__, e)
                continue
            registry.register(ep.name, plugin)
        return registry

    def register(self, name: str, plugin: object) -> None:
        """Add ``plugin``'s hooks (its callable attributes named like hook points)."""
        found = [h for h in HOOK_NAMES if callable(getattr(plugin, attribute_of(h), None))]
        for hook in found:
            self._hooks.setdefault(hook, []).append((name, getattr(plugin, attribute_of(hook))))
        if found:
            log.info("hook plugin %s: %s", name, ", ".join(found))
        else:
            log.warning("hook plugin %s implements no hook point", name)

    def has(self, hook: HookName) -> bool:
        """Whether any plugin implements ``hook`` (callers skip building payloads if not)."""
        return bool(self._hooks.get(hook))

    def call(self, hook: HookName, payload: Payload) -> Payload:
        """Run ``hook`` in every plugin; returns the payload with their mutations merged in
        (for observer hooks, ``payload`` itself). Never raises for a plugin's fault."""
        hooks = self._hooks.get(hook)
        if not hooks:
            return payload
        allowed = MUTATIONS.get(hook)
        current = dict(payload)
        for plugin, fn in hooks:
            result = self._invoke(hook, plugin, fn, dict(current))
            if allowed is None or result is None:
                continue
            changes = _accepted(hook, plugin, allowed, result)
            current.update(changes)
            if any(changes.get(k) for k in _FINAL_KEYS):
                break
        return payload if allowed is None else current

    async def acall(self, hook: HookName, payload: Payload) -> Payload:
        """:meth:`call` from async code, on a worker thread (skipped when nobody listens)."""
        if not self.has(hook):
            return payload
        return await anyio.to_thread.run_sync(self.call, hook, payload)

    def _invoke(self, hook: HookName, plugin: str, fn: Hook, payload: Payload) -> object:
        """One hook call on its own (daemon) thread, waited for at most ``timeout``."""
        outcome: list[object] = []
        failure: list[BaseException] = []

        def target() -> None:
            try:
                outcome.append(fn(payload))
            except BaseException as e:  # a plugin must not kill the thread silently either
                failure.append(e)

        t = threading.Thread(target=target, name=f"fermix-hook-{hook}-{plugin}", daemon=True)
        t.start()
        t.join(self.timeout)
        if t.is_alive():
            log.warning("hook %s of plugin %s timed out after %.1fs; ignored",
                        hook, plugin, self.timeout)
            return None
        if failure:
            # The type only: messages and tracebacks can quote the payload.
            log.warning("hook %s of plugin %s raised %s; ignored",
                        hook, plugin, type(failure[0]).__name__)
            return None
        return outcome[0] if outcome else None


def attribute_of(hook: HookName) -> str:
    """The plugin attribute that implements ``hook``: its name, a colon as ``_``."""
    return hook.replace(":", "_")


def command_hook(command: str) -> HookName | None:
    """The hook of one chat command (``new`` -> ``command:new``), None if it has none."""
    name = f"command:{command}"
    return next((h for h in HOOK_NAMES if h == name), None)


def _accepted(
    hook: HookName, plugin: str, allowed: dict[str, type | tuple[type, ...]], result: object
) -> Payload:
    """The well-typed, allowed part of a mutating hook's return value."""
    if not isinstance(result, dict):
        log.warning("hook %s of plugin %s returned %s, not a dict; ignored",
                    hook, plugin, type(result).__name__)
        return {}
    changes: Payload = {}
    for key, value in result.items():
        expected = allowed.get(key)
        if expected is None or not isinstance(value, expected):
            log.warning("hook %s of plugin %s returned key %r of type %s; ignored",
                        hook, plugin, key, type(value).__name__)
            continue
        if key == "block" and value is True:  # Fased style: block without a reason
            value = f"blocked by hook plugin {plugin}"
        changes[key] = value
    return changes


_lock = threading.Lock()
_registry: HookRegistry | None = None


def get_hooks() -> HookRegistry:
    """Process-wide registry, loaded from entry points once (many greenlets start at once)."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                from fermix_shared.settings import get_settings

                _registry = HookRegistry.from_entry_points(
                    timeout=get_settings().hook_timeout_seconds
                )
    return _registry


def set_hooks(registry: HookRegistry | None) -> None:
    """Replace the process-wide registry (``None``: load from entry points on next use)."""
    global _registry
    with _lock:
        _registry = registry
