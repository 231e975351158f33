"""Who a model call is charged to: its scopes, and the attribution a caller charges it to.

Every call counts in four scopes: ``total``, ``agent:<name>``, ``conversation:<channel|chat|
thread>`` and ``user:<channel>:<id>``. The user of a Telegram or Slack message is its sender
(``telegram:123``); on the HTTP API, which has one caller, the chat stands for the user
(``http:<chatId>``, as for the per-sender rate limit); a scheduled job's runs are
``schedule:<job>``. Usage is not keyed by history, so ``/new`` resets no spending.

Whoever runs a model call charges its router to an :class:`Attribution` when it takes the
router (the worker's ``usage/metered.py``, ``charged_to``): the turn (the turn's own agent,
conversation and user), a subagent or skill run (its *parent* turn's: their spending counts
against the parent's budgets), a compaction and a memory review (the conversation they run
for). The attribution travels with the router, never in ambient state, so concurrent turns in
one worker never mix.

What made a call (its :data:`CallKind`) is counted apart too, fleet-wide, in ``kind:<kind>``
(``kind:compaction``, ``kind:memory_review``, ...): ``fermix usage --by kind`` and
``/v1/usage?by=kind`` read those. They are tallies, not scopes a budget is set on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from fermix_shared.agents.definitions import AGENT_NAME_RE
from fermix_shared.models import Channel, ConversationKey, InboundMessage

ScopeKind = Literal["total", "agent", "conversation", "user"]
SCOPE_KINDS: tuple[ScopeKind, ...] = get_args(ScopeKind)
TOTAL = "total"
# What made the call: every kind is charged the same way, and counted apart in kind_scope.
CallKind = Literal["turn", "scheduled", "subagent", "skill", "compaction", "memory_review"]
CALL_KINDS: tuple[CallKind, ...] = get_args(CallKind)
_CHANNELS: tuple[str, ...] = get_args(Channel)


def agent_scope(name: str) -> str:
    return f"agent:{name}"


def conversation_scope(conv: str) -> str:
    return f"conversation:{conv}"


def user_scope(user: str) -> str:
    return f"user:{user}"


def kind_scope(kind: CallKind) -> str:
    """The tally of every call of ``kind`` (module docstring)."""
    return f"kind:{kind}"


def scope_kind(scope: str) -> ScopeKind:
    kind = scope.split(":", 1)[0]
    if kind in SCOPE_KINDS:
        return kind
    raise ValueError(f"not a usage scope: {scope!r}")


def user_of(msg: InboundMessage) -> str:
    """The user a message's spending counts against (see the module docstring)."""
    if msg.key.channel == "http":
        return f"http:{msg.key.chat_id}"
    if msg.key.channel == "console":  # the token that signed in
        return f"console:{msg.sender_id}"
    if msg.key.channel == "schedule" or msg.sender_id.startswith("schedule:"):
        return msg.sender_id
    return f"{msg.key.channel}:{msg.sender_id}"


def conversation_of(text: str) -> str:
    """A conversation as ``channel|chat|thread``, or ``channel:chat`` (its root thread).
    ValueError with the reason when it cannot be one."""
    if "|" in text:
        parts = text.split("|")
        if len(parts) != 3:
            raise ValueError(f"a conversation is channel|chat|thread, not {text!r}")
        channel, chat, thread = parts
    else:
        channel, _, chat = text.partition(":")
        thread = "root"
    if channel not in _CHANNELS:
        raise ValueError(f"unknown channel {channel!r} in {text!r} (one of {', '.join(_CHANNELS)})")
    if not (ConversationKey.valid_part(chat) and ConversationKey.valid_part(thread)):
        raise ValueError(f"not a conversation: {text!r}")
    return f"{channel}|{chat}|{thread}"


def parse_scope(text: str) -> str:
    """A scope as given by a person (``total``, ``agent:ops``, ``conversation:telegram:42``,
    ``user:slack:U042``), in its stored form. ValueError with the reason otherwise."""
    text = text.strip()
    if text == TOTAL:
        return TOTAL
    kind, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"a scope is total, agent:NAME, conversation:CHANNEL:CHAT or "
                         f"user:CHANNEL:ID, not {text!r}")
    if kind == "agent":
        if not AGENT_NAME_RE.match(rest):
            raise ValueError(f"not an agent name: {rest!r}")
        return agent_scope(rest)
    if kind == "conversation":
        return conversation_scope(conversation_of(rest))
    if kind == "user":
        channel, sep, who = rest.partition(":")
        if channel not in _CHANNELS or not sep or not who or any(c.isspace() for c in who):
            raise ValueError(f"a user is CHANNEL:ID (telegram:123, slack:U042, http:CHAT), "
                             f"not {rest!r}")
        return user_scope(rest)
    raise ValueError(f"unknown scope kind {kind!r} (total, agent, conversation or user)")


@dataclass(frozen=True)
class Attribution:
    """Who one model call is charged to (and what made it)."""

    agent: str
    conversation: str
    user: str
    run_id: str
    kind: CallKind = "turn"

    def scopes(self) -> list[str]:
        """``total`` and the agent, conversation and user scopes this call counts in."""
        out = [TOTAL]
        if self.agent:
            out.append(agent_scope(self.agent))
        if self.conversation:
            out.append(conversation_scope(self.conversation))
        if self.user:
            out.append(user_scope(self.user))
        return out

    def counted_in(self) -> list[str]:
        """Where the call's usage is counted: its :meth:`scopes` and its kind's tally."""
        return [*self.scopes(), kind_scope(self.kind)]


def attribution_for(msg: InboundMessage, kind: CallKind | None = None) -> Attribution:
    """The attribution of calls made for ``msg`` (a turn's, or a compaction's in its
    conversation)."""
    if kind is None:
        kind = "scheduled" if msg.context == "scheduled" else "turn"
    return Attribution(agent=msg.agent, conversation=msg.key.as_str(), user=user_of(msg),
                       run_id=msg.run_id, kind=kind)


def turn_scopes(msg: InboundMessage) -> list[str]:
    """The scopes a new turn of ``msg`` is charged to: those its budgets are checked on."""
    return attribution_for(msg).scopes()
