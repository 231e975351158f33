"""The chaos run's audit: what the fleet did with every accepted message, read back from Redis
(run records, conversation histories, run events) and from the scripted model's request log.

Parse, then judge: :func:`read_chats` and :func:`read_runs` only read; :func:`audit` only
counts. The numbers mean:

- ``answered``: runs that ended ``ok``; ``errored``/``stopped``: runs that ended so.
- ``lost``: accepted, yet no answer in its chat's history and no terminal run (or no run at all).
- ``duplicated``: user messages stored or answered twice in history, seen twice in a prompt
  the model received, or accepted as a second run when POSTed again with the same
  ``messageId`` (``reasked`` counts messages the model was asked to answer more than once,
  which a resumed turn legitimately does: information, not a failure).
- ``order_violations``: an answer (or user message) in a chat's history after one with a higher
  number. ``crossed``: an answer in the wrong chat, or a run whose reply names another message.
- ``stuck``: conversations with an active turn or queued messages after the settle period.
- ``resume_s``: from a worker's SIGKILL to the resumed ``start`` of each turn it held.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import redis

from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey

TEXT_RE = re.compile(r"chat-(\d+) #(\d+)")
ANSWER_RE = re.compile(r"answer to chat-(\d+) #(\d+)")
TERMINAL = frozenset({"ok", "error", "stopped"})
MessageRef = tuple[int, int]  # (chat, number)


def text_of(chat: int, n: int) -> str:
    return f"chat-{chat} #{n}"


def answer_of(chat: int, n: int) -> str:
    return f"answer to {text_of(chat, n)}"


def chat_id(chat: int) -> str:
    return f"chat-{chat}"


def conv_of(chat: int) -> str:
    return ConversationKey(channel="http", chat_id=chat_id(chat)).as_str()


def ref(pattern: re.Pattern[str], text: str) -> MessageRef | None:
    m = pattern.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


# -- what the model saw ----------------------------------------------------------------------

@dataclass(frozen=True)
class ModelCall:
    """One turn request the scripted model received: the message it was asked to answer and
    the numbers of that chat's user messages and answers in the prompt before it."""

    asked: MessageRef
    at: float
    users: tuple[int, ...]
    answers: tuple[int, ...]
    foreign: int  # messages of another chat in the prompt


def _content(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def parse_model_call(body: Any, at: float) -> ModelCall | None:
    """A Chat Completions body asking to answer a numbered message; None for anything else
    (the memory review's request, which quotes the exchange, is not a turn)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    asked = ref(TEXT_RE, _content(last)) if last.get("role") == "user" else None
    if asked is None:
        return None
    users: list[int] = []
    answers: list[int] = []
    foreign = 0
    for m in messages[:-1]:
        role, text = m.get("role"), _content(m)
        seen = ref(TEXT_RE, text) if role == "user" else (
            ref(ANSWER_RE, text) if role == "assistant" else None)
        if seen is None:
            continue
        if seen[0] != asked[0]:
            foreign += 1
        else:
            (users if role == "user" else answers).append(seen[1])
    return ModelCall(asked, at, tuple(users), tuple(answers), foreign)


# -- what Redis holds ------------------------------------------------------------------------

@dataclass
class ChatHistory:
    """One chat's history, reduced to numbers: its user messages and answers in stored order."""

    users: list[int] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    crossed: int = 0  # a message of another chat stored here
    other_replies: int = 0  # assistant messages that answer nothing (the generic error, ...)
    active: bool = False
    queued: int = 0


def read_chats(r: redis.Redis, chats: int) -> dict[int, ChatHistory]:
    out: dict[int, ChatHistory] = {}
    for base in range(0, chats, 200):
        batch = range(base, min(chats, base + 200))
        pipe = r.pipeline(transaction=False)
        for c in batch:
            conv = conv_of(c)
            pipe.lrange(keys.history(conv), 0, -1)
            pipe.exists(keys.active(conv))
            pipe.llen(keys.inbox(conv))
        replies = pipe.execute()
        for i, c in enumerate(batch):
            raw, active, queued = replies[3 * i: 3 * i + 3]
            h = ChatHistory(active=bool(active), queued=int(queued))
            for item in raw:
                msg = ChatMessage.model_validate_json(item)
                if msg.role == "tool" or msg.tool_calls:
                    continue
                seen = ref(TEXT_RE if msg.role == "user" else ANSWER_RE, msg.content)
                if seen is None:
                    h.other_replies += msg.role == "assistant"
                elif seen[0] != c:
                    h.crossed += 1
                else:
                    (h.users if msg.role == "user" else h.answers).append(seen[1])
            out[c] = h
    return out


def read_runs(r: redis.Redis, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Run records by id (JSON, read loosely: only status, reply and times are used)."""
    out: dict[str, dict[str, Any]] = {}
    for base in range(0, len(run_ids), 1000):
        batch = list(run_ids[base: base + 1000])
        for run_id, raw in zip(batch, r.mget([keys.run(x) for x in batch]), strict=True):
            if raw is not None:
                out[run_id] = json.loads(raw)
    return out


def unfinished(r: redis.Redis, run_ids: Iterable[str]) -> set[str]:
    """The runs among ``run_ids`` that have not ended (or have no record)."""
    recs = read_runs(r, list(run_ids))
    return {x for x in run_ids if recs.get(x, {}).get("status") not in TERMINAL}


def busy_chats(r: redis.Redis, chats: int) -> int:
    """Conversations with an active turn or queued messages."""
    pipe = r.pipeline(transaction=False)
    for c in range(chats):
        pipe.exists(keys.active(conv_of(c)))
        pipe.llen(keys.inbox(conv_of(c)))
    res = pipe.execute()
    return sum(1 for c in range(chats) if res[2 * c] or res[2 * c + 1])


def resumed_at(r: redis.Redis, run_id: str, after: float) -> float | None:
    """When the run started again (a ``lifecycle`` ``start`` with ``resumed``) after ``after``
    (unix seconds), from its event stream's ids; else the transient error that announces it."""
    error_at: float | None = None
    entries: list[tuple[str, dict[str, str]]] = r.xrange(keys.run_events(run_id))  # type: ignore[assignment]
    for entry_id, fields in entries:
        at = int(str(entry_id).split("-")[0]) / 1000
        if at < after or fields.get("stream") != "lifecycle":
            continue
        data = json.loads(fields.get("data", "{}"))
        if data.get("phase") == "start" and data.get("resumed"):
            return at
        if data.get("phase") == "error" and data.get("transient") and error_at is None:
            error_at = at
    return error_at


# -- the summary -----------------------------------------------------------------------------

FaultKind = Literal["kill-worker", "restart-redis", "restart-gateway"]


@dataclass
class FaultRecord:
    """A fault as it happened: ``at_s`` from the first message, ``down_s`` until the part was
    serving again (a restarted worker: until its heartbeat; unset when it was not seen)."""

    kind: FaultKind
    at_s: float
    target: str
    down_s: float | None = None
    held: dict[str, str] = field(default_factory=dict)  # run id -> conversation (kills)
    killed_at: float = 0.0  # unix time of the kill
    resumed: int = 0
    not_resumed: int = 0
    resume_max_s: float | None = None


@dataclass
class Accepted:
    chat: int
    n: int
    run_id: str


def spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": round(min(values), 2), "median": round(statistics.median(values), 2),
            "max": round(max(values), 2)}


@dataclass
class Summary:
    planned: int
    accepted: int
    answered: int
    errored: int
    stopped: int
    lost: int
    duplicated: int
    order_violations: int
    crossed: int
    stuck: int
    not_accepted: int = 0  # refused (4xx) or given up at the time cap
    unconfirmed_in_history: int = 0  # never confirmed to the client, yet stored (accepted)
    history_mismatch: int = 0  # run ok without its answer in history, or the reverse
    errored_unanswered: int = 0  # error runs whose user message sits in history unanswered
    duplicated_history: int = 0
    duplicated_prompt: int = 0
    reasked: int = 0
    model_requests: int = 0
    post_retries_connection: int = 0
    post_retries_5xx: int = 0
    post_throttled: int = 0
    post_deduplicated: int = 0
    replayed: int = 0  # accepted messages POSTed again on purpose, same messageId
    replays_doubled: int = 0  # ... that the gateway accepted as a new run
    resume_s: dict[str, float] | None = None
    resumed_turns: int = 0
    not_resumed_turns: int = 0
    faults: list[FaultRecord] = field(default_factory=list)
    send_s: float = 0.0
    settle_s: float = 0.0
    total_s: float = 0.0
    cut_short: bool = False
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.order_violations or self.crossed
                    or self.stuck)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["faults"] = [{**{k: v for k, v in asdict(f).items() if k != "held"},
                          "held": len(f.held)} for f in self.faults]
        out["ok"] = self.ok
        return out

    def render(self) -> str:
        resume = self.resume_s or {}
        lines = [
            f"chaos run: {self.planned} messages, {self.config.get('chats')} chats, "
            f"{self.config.get('workers')} workers, seed {self.config.get('seed')}"
            + (" (CUT SHORT by --duration)" if self.cut_short else ""),
            f"  accepted {self.accepted}   answered (ok) {self.answered}   errored "
            f"{self.errored}   stopped {self.stopped}   not accepted {self.not_accepted}",
            f"  LOST {self.lost}   DUPLICATED {self.duplicated} (history {self.duplicated_history}"
            f", prompts {self.duplicated_prompt})   ORDER VIOLATIONS {self.order_violations}   "
            f"CROSSED {self.crossed}   STUCK {self.stuck}",
            f"  run/history mismatch {self.history_mismatch}   errored with the user message "
            f"unanswered in history {self.errored_unanswered}   unconfirmed POSTs found stored "
            f"{self.unconfirmed_in_history}",
            f"  model requests {self.model_requests} (turn messages asked more than once: "
            f"{self.reasked})",
            f"  client: retried after a connection error {self.post_retries_connection}, after "
            f"a 5xx {self.post_retries_5xx}, throttled {self.post_throttled}; answered as "
            f"duplicates {self.post_deduplicated}; replayed on purpose {self.replayed}, "
            f"doubled by a replay {self.replays_doubled}",
            f"  kill -> resume: {self.resumed_turns} turns resumed, {self.not_resumed_turns} not; "
            f"min {resume.get('min', '-')} s, median {resume.get('median', '-')} s, "
            f"max {resume.get('max', '-')} s",
        ]
        for f in self.faults:
            down = "-" if f.down_s is None else f"{f.down_s:.1f} s"
            extra = (f", held {len(f.held)} turns, resumed {f.resumed}, worst "
                     f"{f.resume_max_s if f.resume_max_s is not None else '-'} s"
                     if f.kind == "kill-worker" else "")
            lines.append(f"    {f.at_s:7.1f} s  {f.kind:<15} {f.target:<12} back in {down}{extra}")
        lines.append(f"  time: sending {self.send_s:.0f} s, settling {self.settle_s:.0f} s, "
                     f"total {self.total_s:.0f} s")
        lines.append("  result: " + ("OK" if self.ok else "FAILED (lost, duplicated, order, "
                                     "crossed or stuck is not 0)"))
        return "\n".join(lines)


def _inversions(seq: Sequence[int]) -> int:
    return sum(1 for a, b in zip(seq, seq[1:], strict=False) if b < a)


def _doubled(seq: Sequence[int]) -> set[int]:
    return {n for n, k in Counter(seq).items() if k > 1}


def audit(r: redis.Redis, chats: int, accepted: Sequence[Accepted],
          unconfirmed: Iterable[MessageRef], calls: Sequence[ModelCall],
          faults: list[FaultRecord], doubled: Iterable[MessageRef] = ()) -> Summary:
    """Count what the fleet did with every accepted message (see the module docstring).
    ``doubled``: messages a replayed POST accepted as a new run."""
    hist = read_chats(r, chats)
    recs = read_runs(r, [a.run_id for a in accepted])
    s = Summary(planned=0, accepted=len(accepted), answered=0, errored=0, stopped=0, lost=0,
                duplicated=0, order_violations=0, crossed=0, stuck=0)
    dup_history: set[MessageRef] = set()
    for c, h in hist.items():
        dup_history |= {(c, n) for n in _doubled(h.users) | _doubled(h.answers)}
        s.order_violations += _inversions(h.users) + _inversions(h.answers)
        s.crossed += h.crossed
        s.stuck += h.active or h.queued > 0
    answered_in = {(c, n) for c, h in hist.items() for n in h.answers}
    users_in = {(c, n) for c, h in hist.items() for n in h.users}
    for a in accepted:
        rec = recs.get(a.run_id, {})
        status, in_history = rec.get("status"), (a.chat, a.n) in answered_in
        s.answered += status == "ok"
        s.errored += status == "error"
        s.stopped += status == "stopped"
        s.lost += status not in TERMINAL and not in_history
        s.history_mismatch += (status == "ok") != in_history
        s.errored_unanswered += (status == "error" and not in_history
                                 and (a.chat, a.n) in users_in)
        s.crossed += status == "ok" and rec.get("reply") != answer_of(a.chat, a.n)
    s.unconfirmed_in_history = len(set(unconfirmed) & users_in)
    dup_prompt: set[MessageRef] = set()
    for call in calls:
        c = call.asked[0]
        dup_prompt |= {(c, n) for n in _doubled(call.users) | _doubled(call.answers)}
        s.crossed += call.foreign
    asked = Counter(call.asked for call in calls)
    s.reasked = sum(1 for k in asked.values() if k > 1)
    s.model_requests = len(calls)
    s.duplicated_history, s.duplicated_prompt = len(dup_history), len(dup_prompt)
    s.replays_doubled = len(set(doubled))
    s.duplicated = len(dup_history | dup_prompt | set(doubled))
    waits: list[float] = []
    for f in faults:
        if f.kind != "kill-worker":
            continue
        mine = []
        for run_id in f.held:
            at = resumed_at(r, run_id, f.killed_at)
            if at is None:
                f.not_resumed += 1
            else:
                mine.append(at - f.killed_at)
        f.resumed, f.resume_max_s = len(mine), round(max(mine), 2) if mine else None
        waits += mine
    s.resume_s, s.resumed_turns = spread(waits), len(waits)
    s.not_resumed_turns = sum(f.not_resumed for f in faults)
    s.faults = faults
    return s
