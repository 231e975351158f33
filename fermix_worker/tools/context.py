"""What a tool call may use of its run: :class:`RunContext`, handed to every tool explicitly.

The caller of a loop (the turn, :mod:`fermix_worker.turn.drive`; a subagent,
:mod:`fermix_worker.subagents.runner`) builds one context for the run: the calling turn, if
any (:class:`TurnContext`: scheduling a job from a chat, the turn's workspace), a subagent's
own (:class:`SubagentContext`: its trust, the workspace it reads), and the audit recorder bound
to who acts. The loop passes it through, giving each tool call its own copy
with a progress reporter (:meth:`RunContext.for_call`), and the registry hands it to the tool
(``Tool.run(ctx, arguments)``), as pydantic-ai's ``RunContext`` and openai-agents'
``RunContextWrapper`` do. Nothing here is ambient: concurrent turns in one gevent worker see
only the context they were given.

This module knows nothing of Redis or the audit store: the recorder is whatever the caller
bound (:class:`fermix_shared.audit.Recorder` in production), and without one nothing is
recorded, as without a reporter nothing is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from fermix_shared.models import ConversationKey, InboundMessage, Trust
from fermix_worker.tools.progress import MAX_UPDATE_CHARS, throttled

if TYPE_CHECKING:  # types only: the loop carries this module and imports no audit store
    from fermix_shared.audit.model import Kind, Outcome, Scalar


@dataclass(frozen=True)
class TurnContext:
    """Who is calling: the conversation, the sender, their trust, and (scheduled runs) where
    the run delivers."""

    key: ConversationKey
    sender_id: str
    trust: Trust
    run_id: str
    deliver_to: ConversationKey | None = None
    # The platform's id of the user's message that started the turn (what ``react`` reacts
    # to; None: no such message, e.g. a scheduled run or an HTTP turn without one).
    reply_to: str | None = None
    # The agent that runs the turn (fermix_shared/agents/definitions.py): its workspace, for one.
    agent: str = "default"
    # The turn's own tool subset (a scheduled run's, narrowed by its agent's list; None: none)
    # and whether the turn is offered a tool (None: not known here, so nothing is assumed):
    # a job the turn schedules may use no more than the turn.
    allowed_tools: tuple[str, ...] | None = None
    offers: Callable[[str], bool] | None = None

    @classmethod
    def of(cls, msg: InboundMessage, offers: Callable[[str], bool] | None = None) -> TurnContext:
        """``msg``'s turn, offered the tools ``offers`` says."""
        return cls(key=msg.key, sender_id=msg.sender_id, trust=msg.trust, run_id=msg.run_id,
                   deliver_to=msg.deliver_to, reply_to=msg.reply_to, agent=msg.agent,
                   allowed_tools=None if msg.allowed_tools is None else tuple(msg.allowed_tools),
                   offers=offers)

    @property
    def origin(self) -> ConversationKey | None:
        """Where "reply here" goes: the chat itself, or a scheduled run's own delivery."""
        return self.deliver_to if self.key.channel == "schedule" else self.key


@dataclass(frozen=True)
class SubagentContext:
    """A subagent's run, which has no turn of its own: the trust its tools act at (its parent
    turn's, or a skill's lower one) and the workspace it may read but never write (its parent
    turn's root, resolved when the fan-out started; None: the parent has none)."""

    trust: Trust
    workspace: str | None = None


class AuditRecorder(Protocol):
    """Records an audit entry as whoever the run acts for (fails open: never raises)."""

    def record(self, kind: Kind, action: str, outcome: Outcome, **detail: Scalar) -> object: ...


class _NoAudit:
    """A run nobody audits (a unit test's loop): records nothing."""

    def record(self, kind: Kind, action: str, outcome: Outcome, **detail: Scalar) -> None:
        return None


NO_AUDIT: AuditRecorder = _NoAudit()


@dataclass(frozen=True)
class RunContext:
    """A run's context as a tool sees it: the calling turn (None: a subagent's or a test's
    run), a subagent's own context (None: not a subagent), the audit recorder, and (inside one
    tool call) who watches its progress."""

    turn: TurnContext | None = None
    audit: AuditRecorder = field(default=NO_AUDIT)
    # The running call's progress reporter (throttled); None outside a call or unwatched.
    progress: Callable[[str], None] | None = None
    subagent: SubagentContext | None = None

    @property
    def trust(self) -> Trust | None:
        """The trust the run acts at: its turn's, else its subagent's (None: neither)."""
        if self.turn is not None:
            return self.turn.trust
        return self.subagent.trust if self.subagent is not None else None

    @classmethod
    def for_turn(cls, msg: InboundMessage, offers: Callable[[str], bool] | None = None, *,
                 audit: AuditRecorder = NO_AUDIT) -> RunContext:
        """The context of ``msg``'s turn (offered the tools ``offers`` says), audited by
        ``audit``."""
        return cls(turn=TurnContext.of(msg, offers), audit=audit)

    def for_call(self, emit: Callable[[str], None]) -> RunContext:
        """This context for one tool call whose reports go to ``emit``, rate-limited per call
        (:data:`~fermix_worker.tools.progress.MIN_INTERVAL_S`)."""
        return replace(self, progress=throttled(emit))

    def report(self, text: str) -> None:
        """Tell whoever watches the running tool call how it is doing (cheap; may be dropped
        when reports come faster than the reporter's interval; nobody watching: nothing)."""
        if self.progress is not None and text:
            self.progress(text[-MAX_UPDATE_CHARS:])
