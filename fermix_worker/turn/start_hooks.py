"""The hook points of a new turn's start, beside the explicit ones in
:mod:`~fermix_worker.turn.start` (``before_model_resolve``, ``before_prompt_build``):

* ``session_start``: the conversation's first message (its first turn, or the first after
  ``/new``), once per session (:mod:`fermix_shared.stores.sessions`).
* ``agent:bootstrap``: while the prompt's bootstrap files (the prompt memory files,
  ``$FERMIX_HOME/memory/*.md``) are gathered, before the system prompt is built; it may
  return ``files`` (``[{"name", "content"}, ...]``) to add, drop or change some.
* ``before_agent_start``: Fased's legacy hook that may act in either phase: it may return a
  ``provider``/``model`` (seen, and overridable, by ``before_model_resolve``) and a
  ``systemPrompt``/``prependContext`` (a ``before_prompt_build`` value wins over it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.hooks import MUTATIONS, HookRegistry
from fermix_shared.messages import ChatMessage
from fermix_shared.models import InboundMessage

log = logging.getLogger(__name__)

PromptFiles = list[tuple[str, str]]


def start_session(hooks: HookRegistry, msg: InboundMessage, session_id: str | None) -> None:
    """``session_start`` when this turn began the conversation's session (``session_id``:
    the new session's, None when it had one; ``TurnReads.session_id``)."""
    conv = msg.key.as_str()
    if session_id is not None and hooks.has("session_start"):
        hooks.call("session_start", {
            "conversation": conv, "session_id": session_id, "run_id": msg.run_id,
            "agent": msg.agent, "by": msg.sender_id, "channel": msg.key.channel,
        })


def bootstrap_files(hooks: HookRegistry, msg: InboundMessage, agent: AgentDefinition,
                    files: Sequence[tuple[str, str]]) -> PromptFiles:
    """The turn's bootstrap files, after the ``agent:bootstrap`` hooks."""
    if not hooks.has("agent:bootstrap"):
        return list(files)
    out = hooks.call("agent:bootstrap", {
        "run_id": msg.run_id, "agent": agent.name, "conversation": msg.key.as_str(),
        "files": [{"name": name, "content": body} for name, body in files],
    })
    kept: PromptFiles = []
    for entry in out["files"]:
        if (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("content"), str)):
            kept.append((entry["name"], entry["content"]))
        else:
            log.warning("agent:bootstrap returned a file that is not {name, content}; dropped")
    return kept


def before_agent_start(hooks: HookRegistry, msg: InboundMessage, agent: AgentDefinition,
                       past: list[ChatMessage], text: str) -> dict[str, Any]:
    """What the ``before_agent_start`` hooks changed (only the keys they returned)."""
    if not hooks.has("before_agent_start"):
        return {}
    payload: dict[str, Any] = {
        "run_id": msg.run_id, "agent": agent.name, "conversation": msg.key.as_str(),
        "messages": [m.model_dump() for m in past], "text": text,
    }
    out = hooks.call("before_agent_start", payload)
    return {k: out[k] for k in MUTATIONS["before_agent_start"] if k in out}


def hooked_route(hook: str, out: dict[str, Any], provider: str, model: str) -> tuple[str, str]:
    """``provider``/``model`` after a hook's answer (an unknown provider is ignored)."""
    hooked = str(out.get("provider") or provider)
    if hooked not in ("anthropic", "openai"):
        log.warning("%s chose unknown provider %r; keeping %s/%s", hook, hooked, provider, model)
        return provider, model
    return hooked, str(out.get("model") or model)
