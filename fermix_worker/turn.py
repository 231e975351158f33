"""TurnRunner: one claimed turn through prepare, AgentLoop, and close.

The runner owns the turn's side effects (history, run records, events); the loop owns none.
For the HTTP channel, delivery is the run record's ``reply``, written by the same atomic step
that commits history and releases the conversation, and only if the turn still holds the
conversation and was not cancelled (compare-and-deliver). Every turn ends in exactly one of:
delivered (``ok``/``error``), stopped (history gets the seed's marker), or fenced (nothing).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis

from fermix_shared import keys, metrics
from fermix_shared.errors import ConfigError, LeaseLost, TurnCancelled, TurnTimedOut
from fermix_shared.hooks import HookRegistry
from fermix_shared.memory import MemoryStore, load_prompt_memory, memory_section
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import InboundMessage, RunRecord, RunStatus, now
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_shared.stores.events import RunEvents
from fermix_shared.stores.queue import TurnLease
from fermix_worker.compacting import Compacted, CompactionFailed, ConversationCompactor
from fermix_worker.compaction import OVERFLOW_MESSAGE, POST_TURN_NOTICE, PREFLIGHT_NOTICE
from fermix_worker.delivery import ChannelLookup, Deliverer
from fermix_worker.fanout import PARKED, FanOut, FanOutRequest, NoFanOut
from fermix_worker.guard import GuardConfig, LoopGuard
from fermix_worker.lease import LeaseKeeper, turn_deadline
from fermix_worker.loop import AgentLoop, AwaitSubagents, Failed, Final, LoopState, answer_call
from fermix_worker.providers import RoutedProvider, override_route
from fermix_worker.providers.routes import chain_from_settings
from fermix_worker.reply import (
    SILENT_HISTORY_MARKER,
    SilentTokenFilter,
    empty_turn_reply,
    is_silent,
    shape_reply,
)
from fermix_worker.scheduler import record_run
from fermix_worker.subagents.prompts import ULTRA_ADDENDUM
from fermix_worker.tools import ToolScope
from fermix_worker.tools.base import ToolRegistry, ToolResult
from fermix_worker.tools.context import bind_turn

log = logging.getLogger(__name__)

# Tool results longer than this are cut when a turn overflows the context window.
TRIMMED_TOOL_RESULT = 4_000
GENERIC_ERROR = "Sorry — something went wrong while handling that. Please try again."
STOPPED_MARKER = (
    "The previous request was stopped before I finished it. It is kept here for context only…"
)



def _provider_of(route: object) -> str:
    """``openai/gpt-4.1-mini`` -> ``openai`` (metrics label)."""
    return str(route).split("/", 1)[0]


def interruptible_sleep(seconds: float, check: Callable[[], None], tick: float = 0.2) -> None:
    """A provider retry's wait that still honours /stop and a lost lease."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        check()
        time.sleep(min(tick, left))
    check()


def tool_scope(msg: InboundMessage) -> ToolScope:
    """The caller's trust, narrowed to a scheduled job's tool subset when it has one."""
    subset = None if msg.allowed_tools is None else tuple(msg.allowed_tools)
    return ToolScope(msg.trust, allowed_tools=subset)


def merge_texts(messages: list[InboundMessage]) -> str:
    """Collect mode: pending messages become one turn, in arrival order."""
    if len(messages) == 1:
        return messages[0].text
    return "\n\n".join(m.text for m in messages)


class EventSink:
    """LoopEvents over the run's Redis stream; streamed text passes the silent-token filter."""

    def __init__(self, events: RunEvents):
        self._events = events
        self._silent = SilentTokenFilter()

    def assistant_delta(self, text: str) -> None:
        if shown := self._silent.feed(text):
            self._events.emit("assistant", delta=shown)

    def flush(self) -> None:
        if shown := self._silent.flush():
            self._events.emit("assistant", delta=shown)

    def tool_start(self, call: ToolCall) -> None:
        self._events.emit("tool", phase="start", name=call.name, callId=call.id, args=call.arguments)

    def tool_result(self, call: ToolCall, result: ToolResult) -> None:
        self._events.emit(
            "tool", phase="result", name=call.name, callId=call.id,
            isError=result.is_error, result=result.content[:2000],
        )

    def diagnostic(self, kind: str, **data: Any) -> None:
        self._events.emit("diagnostic", kind=kind, **data)

    def thinking(self, text: str) -> None:
        self._events.emit("thinking", text=text[:20_000])


class TurnRunner:
    def __init__(
        self,
        r: redis.Redis,
        settings: Settings,
        tools: ToolRegistry,
        router: Callable[[], RoutedProvider],
        channels: ChannelLookup = lambda name: None,
        hooks: HookRegistry | None = None,
        fanout: FanOut | None = None,
        memory_review: Callable[[str, str, str], None] | None = None,
    ):
        self._r = r
        self._settings = settings
        self._tools = tools
        self._router = router
        self._hooks = hooks or HookRegistry()
        self._deliverer = Deliverer(channels, self._hooks, settings.history_limit)
        self._fanout = fanout or NoFanOut()
        self._review = memory_review or (lambda run_id, conv, trust: None)
        self._compactor = ConversationCompactor(r, settings, router)
        self._memory = MemoryStore(r)
        # Memory files are read once per process (restart workers after editing them).
        self._prompt_base = "\n\n".join(
            p for p in (settings.system_prompt, load_prompt_memory(settings.home)) if p)

    def _system_prompt(self, trust: str) -> str:
        """Prompt base (+ memory files), remembered facts for operators only, and a fresh
        date note (the date is not part of the cached base, so it never goes stale)."""
        today = datetime.now(UTC).strftime("%A %Y-%m-%d %H:%M UTC")
        facts = memory_section(self._memory) if trust == "operator" else ""
        return "\n\n".join(p for p in (self._prompt_base, facts, f"Current date: {today}.") if p)

    def run(self, messages: list[InboundMessage], lease: TurnLease) -> int:
        """Run the claimed turn (messages[0], plus any merged into it).

        Returns how many messages wait behind it, or -1 if the turn was fenced.
        """
        msg = messages[0]
        conv = msg.key.as_str()
        if self._compactor.needed(conv):
            with LeaseKeeper(lease, self._settings.cancel_poll_seconds):
                self._compact(msg, PREFLIGHT_NOTICE, reason="preflight")
        past = history.load(self._r, conv, self._settings.history_limit)
        text, system = merge_texts(messages), self._system_prompt(msg.trust)
        if msg.profile == "ultra":  # /ultra: same loop, wider subagent caps, this addendum
            system = f"{system}\n\n{ULTRA_ADDENDUM}"
        model, override = self._resolve_model(msg)
        if self._hooks.has("before_prompt_build"):
            out = self._hooks.call("before_prompt_build", {
                "run_id": msg.run_id, "messages": [m.model_dump() for m in past], "text": text,
            })
            system = str(out.get("systemPrompt", system))
            if out.get("prependContext"):
                text = f"{out['prependContext']}\n\n{text}"
        user = ChatMessage(role="user", content=text)
        state = LoopState.start(
            run_id=msg.run_id, model=model, system=system, history=past, user=user,
            context=msg.context,
        )
        state.merged_runs = [m.run_id for m in messages[1:]]
        state.route_override = override
        # Checkpoint first: from here on, a worker that dies leaves a resumable turn.
        self._checkpoint(state)
        history.append(self._r, conv, [user])
        return self._drive(msg, lease, state, resumed=False)

    def _resolve_model(self, msg: InboundMessage) -> tuple[str, str | None]:
        """The turn's model, and ``provider/model`` when a ``before_model_resolve`` hook moved
        the turn off the configured primary route (the call then really goes there, with the
        configured fallbacks after it)."""
        primary = chain_from_settings(self._settings)[0]
        if not self._hooks.has("before_model_resolve"):
            return primary.model, None
        out = self._hooks.call("before_model_resolve", {
            "run_id": msg.run_id, "provider": primary.provider, "model": primary.model,
        })
        provider, model = str(out.get("provider") or primary.provider), str(out.get("model") or primary.model)
        if (provider, model) == (primary.provider, primary.model):
            return model, None
        if provider not in ("anthropic", "openai"):
            log.warning("before_model_resolve chose unknown provider %r; keeping %s", provider, primary.name)
            return primary.model, None
        return model, f"{provider}/{model}"

    def resume(self, msg: InboundMessage, lease: TurnLease, attempt: int) -> int:
        """Continue a turn whose worker died, from its last checkpoint."""
        raw = self._r.get(keys.run_state(msg.run_id))
        if raw is None:
            return self.close_orphan(msg, lease, "")
        state = LoopState.model_validate_json(raw)
        log.warning("resuming turn %s (attempt %d) at iteration %d", msg.run_id, attempt, state.iteration)
        RunEvents(self._r, msg.run_id).emit(
            "lifecycle", phase="error", transient=True,
            error="the worker running this turn stopped; resuming it on another worker",
        )
        return self._drive(msg, lease, state, resumed=True)

    def _drive(self, msg: InboundMessage, lease: TurnLease, state: LoopState, *, resumed: bool) -> int:
        s = self._settings
        merged = state.merged_runs
        events = RunEvents(self._r, msg.run_id)
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.worker = RunStatus.running, lease.worker
        record.started_at = record.started_at or now()
        runs.put(self._r, record)
        events.emit("lifecycle", phase="start", startedAt=record.started_at, resumed=resumed)

        def steered() -> list[str]:
            taken = lease.take_steered()
            merged.extend(m.run_id for m in taken)
            return [m.text for m in taken]

        commit: list[ChatMessage] = []
        sink = EventSink(events)
        silent = False  # the model answered only NO_REPLY (or a job [SILENT]): nothing delivered
        deadline = turn_deadline(msg, record.started_at or now(), s)
        try:
            with LeaseKeeper(lease, s.cancel_poll_seconds, deadline) as keeper, \
                    self._deliverer.working(msg), bind_turn(msg):
                check = keeper.check
                router = self._router()
                if state.route_override:
                    router = router.with_primary(override_route(s, state.route_override))
                provider = router.for_turn(
                    on_event=functools.partial(self._routing_event, sink),
                    pinned=state.route,
                    sleep=lambda seconds: interruptible_sleep(seconds, check),
                )
                loop = AgentLoop(
                    provider, self._tools.scoped(tool_scope(msg)), sink,
                    max_tokens=s.max_tokens, check=check, inject=steered,
                    checkpoint=self._checkpoint, hooks=self._hooks,
                    blocking=keeper.interruptible, guard=LoopGuard(GuardConfig.from_settings(s)),
                )
                outcome = loop.run(state)
                for _ in range(2):  # context overflow: shrink the prompt and retry, bounded
                    if not (isinstance(outcome, Failed) and outcome.overflow):
                        break
                    if not self._shrink(msg, state):
                        break
                    outcome = loop.run(state)
                if isinstance(outcome, Failed) and outcome.overflow:
                    outcome = Failed(OVERFLOW_MESSAGE, outcome.detail)
                # A call cut short by /stop or the deadline ends as such, not as its error.
                check()
                if self._hooks.has("agent_end"):
                    self._hooks.call("agent_end", {
                        "run_id": msg.run_id, "messages": [m.model_dump() for m in state.turn_messages()],
                        "ok": isinstance(outcome, Final), "iterations": state.iteration,
                    })
                if isinstance(outcome, Final):
                    silent = is_silent(outcome.text, scheduled=msg.context == "scheduled")
                    commit = self._final_history(state, shape_reply(outcome.text), silent=silent)
        except LeaseLost:
            log.warning("turn %s lost its lease; fenced, not delivering", msg.run_id)
            return -1
        except TurnCancelled:
            return self._close_stopped(msg, lease, merged)
        except TurnTimedOut as e:
            log.warning("turn %s passed its deadline (%g s); stopped", msg.run_id, e.timeout_s)
            outcome = Failed(str(e), str(e))
        except ConfigError as e:
            outcome = Failed(f"Fermix is misconfigured: {e}", str(e))
        except Exception as e:
            log.exception("turn %s crashed", msg.run_id)
            outcome = Failed(GENERIC_ERROR, f"{type(e).__name__}: {e}")
        if isinstance(outcome, AwaitSubagents):
            return self._park(msg, lease, state, outcome.call, sink)
        sink.flush()

        record.ended_at = now()
        if isinstance(outcome, Failed):
            record.status, record.error = RunStatus.error, outcome.message
        else:
            record.status = RunStatus.ok
            record.reply = "" if silent else self._reply_text(commit, state)
        if state.last_input_tokens and msg.context == "interactive":
            # Saved before release, so the next turn's preflight sees it even if it wins the
            # race with the post-turn pass below; measured against the model that answered.
            history.save_measurement(self._r, msg.key.as_str(), state.last_input_tokens,
                                     state.answered_model or state.model)
        remaining = self._deliverer.deliver(msg, lease, record, commit)
        if remaining == -2:  # /stop won the race with our delivery
            return self._close_stopped(msg, lease, merged)
        if remaining >= 0:
            self._announce(record, merged, msg)
            # Memory review off the reply path, for operators' conversations only: not for
            # scheduled runs, nor a turn that merged other messages (a guest's words may be in it).
            if (record.status is RunStatus.ok and commit and not merged and not silent
                    and msg.trust == "operator" and msg.context == "interactive"):
                self._review(msg.run_id, msg.key.as_str(), msg.trust)
            if msg.context == "interactive" and self._compactor.needed(msg.key.as_str()):
                # Post-turn compaction runs next in this conversation, after the reply.
                remaining = queue.push_front(self._r, InboundMessage(
                    key=msg.key, text="", kind="compact", compact_reason="auto",
                    reply_to=msg.reply_to))
        return remaining

    def _compact(
        self, msg: InboundMessage, notice: str | None, *, reason: str
    ) -> Compacted | CompactionFailed | None:
        """Compact the conversation now (its lease is held); announce it on the run's events
        and, when it compacted, send ``notice`` into the chat. Returns the failure instead of
        raising it (history is then unchanged); None when there was nothing to compact."""
        events = RunEvents(self._r, msg.run_id)
        events.emit("compaction", phase="start", reason=reason)
        hook_payload = {"run_id": msg.run_id, "conversation": msg.key.as_str(), "reason": reason}
        if self._hooks.has("before_compaction"):
            self._hooks.call("before_compaction", hook_payload)
        try:
            done = self._compactor.compact(msg.key.as_str())
        except CompactionFailed as e:
            events.emit("compaction", phase="error", reason=reason, error=str(e))
            return e
        sizes = {"beforeTokens": done.before_tokens, "afterTokens": done.after_tokens} if done else {}
        events.emit("compaction", phase="end", reason=reason, compacted=done is not None, **sizes)
        if self._hooks.has("after_compaction"):
            self._hooks.call("after_compaction", {**hook_payload, "compacted": done is not None, **sizes})
        if done and notice:
            self._deliverer.notice(msg, notice, f"{msg.run_id}:compaction")
        return done

    def _shrink(self, msg: InboundMessage, state: LoopState) -> bool:
        """After a context overflow: compact the stored history and rebuild the turn's prompt
        on it, and cut long tool results of this turn. False when nothing could shrink."""
        changed = isinstance(self._compact(msg, None, reason="overflow"), Compacted)
        if changed:
            past = history.load(self._r, msg.key.as_str(), self._settings.history_limit)
            turn = state.turn_messages()
            state.messages = [*past[:-1], *turn]  # the stored history ends with this turn's user message
            state.turn_start = len(past) - 1
        for i, m in enumerate(state.messages):
            if m.role == "tool" and len(m.content) > TRIMMED_TOOL_RESULT:
                cut = m.content[:TRIMMED_TOOL_RESULT] + "\n[cut to fit the context window]"
                state.messages[i] = m.model_copy(update={"content": cut})
                changed = True
        self._checkpoint(state)
        return changed

    def compact_turn(self, msg: InboundMessage, lease: TurnLease) -> int:
        """A compaction in the conversation's order: after a turn crossed the threshold
        (``auto``: the seed's notice when it compacted) or for /compact (a report)."""
        command = msg.compact_reason == "command"
        with LeaseKeeper(lease, self._settings.cancel_poll_seconds):
            done = self._compact(msg, None if command else POST_TURN_NOTICE, reason=msg.compact_reason or "auto")
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.started_at, record.ended_at = RunStatus.ok, record.started_at or now(), now()
        if command:
            if isinstance(done, Compacted):
                record.reply = f"Compacted this conversation: {done.before_tokens} → {done.after_tokens} tokens."
            elif isinstance(done, CompactionFailed):
                record.reply = f"Compaction failed ({done}); the conversation is unchanged."
            else:
                record.reply = "Nothing to compact yet."
        remaining = self._deliverer.deliver(msg, lease, record, [])
        if remaining >= 0:
            emit_end(RunEvents(self._r, msg.run_id), record)
        return remaining

    def _park(
        self, msg: InboundMessage, lease: TurnLease, state: LoopState, call: ToolCall,
        sink: EventSink,
    ) -> int:
        """Checkpointed already: give the worker back and start the fan-out."""
        sink.flush()
        if not lease.park(self._fanout.deadline(call, msg.profile)):
            return -1
        sink.diagnostic("subagents", phase="start", callId=call.id)
        self._fanout.launch(FanOutRequest(
            run_id=msg.run_id, conv=msg.key.as_str(), call=call, trust=msg.trust,
            profile=msg.profile, model=state.model,
        ))
        return PARKED

    def resume_fanout(
        self, conv: str, run_id: str, call_id: str, result: ToolResult, worker: str
    ) -> int:
        """The fan-out's callback: take the parked turn back, answer its call, continue.

        Returns the messages waiting behind it, -1 if the turn was no longer parked (it was
        recovered after its deadline), or PARKED if it fanned out again.
        """
        taken = queue.unpark(self._r, conv, run_id, worker, self._settings.lease_seconds)
        if taken is None:
            log.warning("fan-out for %s came back after its turn was closed; dropped", run_id)
            return -1
        claim, lease = taken
        msg = claim.messages[0]
        raw = self._r.get(keys.run_state(run_id))
        if raw is None:
            return self.close_orphan(msg, lease, claim.cancelled)
        state = LoopState.model_validate_json(raw)
        if claim.cancelled:
            return self._close_stopped(msg, lease, state.merged_runs)
        answer_call(state, call_id, result)
        self._checkpoint(state)
        RunEvents(self._r, run_id).emit("tool", phase="result", name="subagents", callId=call_id,
                                        isError=result.is_error, result=result.content[:2000])
        return self._drive(msg, lease, state, resumed=True)

    @staticmethod
    def _final_history(state: LoopState, reply: str, *, silent: bool = False) -> list[ChatMessage]:
        """What a finished turn commits after its user message; nothing for an empty reply,
        so it cannot poison later turns, unless a tool already replied or the model chose
        silence (then a compact marker, never the silent token)."""
        turn = state.turn_messages()[1:]
        if silent:
            return [*turn[:-1], ChatMessage(role="assistant", content=SILENT_HISTORY_MARKER)]
        if reply:
            return [*turn[:-1], turn[-1].model_copy(update={"content": reply})]
        if state.side_effects:
            marker = f"[replied with {', '.join(sorted(set(state.side_effects)))}]"
            return [*turn[:-1], ChatMessage(role="assistant", content=marker)]
        return []

    @staticmethod
    def _reply_text(commit: list[ChatMessage], state: LoopState) -> str | None:
        if not commit:
            return empty_turn_reply(state.tool_failures)
        if state.side_effects and commit[-1].content.startswith("[replied with"):
            return None  # the tool's reaction or attachment was the reply
        return commit[-1].content

    @staticmethod
    def _routing_event(sink: EventSink, kind: str, **data: Any) -> None:
        """Retries and failovers: a diagnostic run event and a Prometheus counter."""
        sink.diagnostic(kind, **data)
        if kind == "retry":
            metrics.count_retry(
                _provider_of(data.get("route")),
                "transient" if data.get("initial") else "continuation",
            )
        elif kind == "failover":
            metrics.count_failover(_provider_of(data.get("from_route")), _provider_of(data.get("to_route")))

    def _checkpoint(self, state: LoopState) -> None:
        self._r.set(keys.run_state(state.run_id), state.model_dump_json(), ex=keys.RUN_TTL_SECONDS)

    def _close_stopped(self, msg: InboundMessage, lease: TurnLease, merged: list[str]) -> int:
        """Close a cancelled turn: ``stopped``, nothing delivered, the marker in history."""
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.ended_at, record.reply = RunStatus.stopped, now(), None
        marker = ChatMessage(role="assistant", content=STOPPED_MARKER)
        remaining = lease.finish(
            record, [marker.model_dump_json()], self._settings.history_limit, deliver=False
        )
        if remaining >= 0:
            self._announce(record, merged, msg)
        return remaining

    def close_orphan(self, msg: InboundMessage, lease: TurnLease, cancelled: str) -> int:
        """Close a turn whose worker died: stopped if it had been cancelled, else ``error``
        with the generic error (nothing was delivered: delivery and release are one step)."""
        if cancelled:
            return self._close_stopped(msg, lease, [])
        record = runs.get(self._r, msg.run_id) or RunRecord(run_id=msg.run_id, conversation=msg.key)
        record.status, record.ended_at, record.error = RunStatus.error, now(), GENERIC_ERROR
        remaining = self._deliverer.deliver(msg, lease, record, [])
        if remaining >= 0:
            self._announce(record, [], msg)
        return remaining

    def _announce(self, record: RunRecord, merged: list[str], msg: InboundMessage | None = None) -> None:
        """Terminal lifecycle events for the run and for runs merged into it (collect/steer),
        which share its outcome; a scheduled job's run also goes to the job's history."""
        metrics.count_turn(record.status)
        if msg is not None and msg.job is not None:
            record_run(self._r, msg, record)
        for run_id in merged:
            copy = record.model_copy(update={"run_id": run_id, "merged_into": record.run_id})
            runs.put(self._r, copy)
            emit_end(RunEvents(self._r, run_id), copy)
        emit_end(RunEvents(self._r, record.run_id), record)


def emit_end(events: RunEvents, record: RunRecord) -> None:
    """The run's one terminal lifecycle event."""
    if record.status is RunStatus.error:
        events.emit("lifecycle", phase="error", endedAt=record.ended_at, error=record.error)
    else:
        events.emit("lifecycle", phase="end", endedAt=record.ended_at,
                    status=record.status.value, reply=record.reply)
