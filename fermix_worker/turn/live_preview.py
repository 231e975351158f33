"""The thread that shows one turn's reply in the chat while the model writes it.

A :class:`LiveReply` is fed by the turn's :class:`~fermix_worker.turn.events.EventSink`
(coalesced text, tool-call boundaries) without ever blocking it: one background thread (a
greenlet under the gevent pool) per turn does the network work, so a slow or rate-limited
platform delays the preview, never the model. ``partial`` posts one message and edits it at
the chat's pace; ``block`` sends finished paragraphs as messages of their own. What it has
shown is in the run's :class:`~fermix_worker.turn.live_store.LiveStore`, so a resumed turn
carries on where the last worker stopped. The modes, and how a turn ends, are described in
:mod:`fermix_worker.turn.live_reply`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Literal, Protocol

import redis

from fermix_shared.channels.base import ChannelError, EditsMessages, OutboundChannel, RateLimited
from fermix_shared.channels.ratelimit import RateLimiter
from fermix_shared.models import ConversationKey
from fermix_worker.turn.live_store import LiveStore

log = logging.getLogger(__name__)

LiveMode = Literal["partial", "block"]


class LiveChannel(OutboundChannel, EditsMessages, Protocol):
    """A channel that sends replies and can change a message while it is written."""

# The first live version waits until the text has been coming this long: a short reply is
# one message (no notification for a fragment, no edit), a long one shows early.
FIRST_AFTER_S = 1.0
# A block is sent once this much finished text (whole paragraphs) is ready.
BLOCK_MIN_CHARS = 800
# Live changes that fail in a row before the turn stops previewing (the final still lands).
MAX_FAILURES = 3
# How long closing waits for a change in flight (an HTTP call, a paced send).
JOIN_TIMEOUT_S = 60.0

_FENCE = re.compile(r"^[ \t]{0,3}(?:`{3,}|~{3,})", re.M)


class LiveReply:
    """One turn's reply as it is written (see :mod:`fermix_worker.turn.live_reply`). ``text``
    and ``boundary`` are the EventSink's listener calls; :meth:`close` ends it."""

    def __init__(self, channel: LiveChannel, r: redis.Redis, key: ConversationKey,
                 run_id: str, mode: LiveMode, *, first_after: float = FIRST_AFTER_S,
                 clock: Callable[[], float] = time.monotonic):
        self._channel = channel
        self._store = LiveStore(r, run_id)
        self._limiter = RateLimiter(r, self._nap)
        self._key = key
        self._run_id = run_id
        self._mode = mode
        self._first_after = first_after
        self._clock = clock
        self._cond = threading.Condition()
        self._text = ""  # the assistant message being written, as streamed
        self._done: list[str] = []  # block: messages finished, whose rest is still to send
        self._since: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        # Owned by the thread (and by close, after joining it).
        self._mid: str | None = None
        self._shown = ""
        self._sent = ""
        self._blocks = 0
        self._failures = 0
        self._last = ""  # the text the last change was decided on

    # -- the EventSink's side: never blocks on the network ----------------------------------

    def text(self, piece: str) -> None:
        with self._cond:
            if self._closed:
                return
            self._text += piece
            if self._since is None:
                self._since = self._clock()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"live-{self._run_id}")
                self._thread.start()
            self._cond.notify()

    def boundary(self) -> None:
        """A tool call starts: the next text is a new assistant message."""
        with self._cond:
            if self._text:
                if self._mode == "block":
                    self._done.append(self._text)
                self._text = ""
                self._cond.notify()

    def close(self, *, parked: bool = False) -> None:
        """Stop previewing and wait for a change in flight (the final delivery comes next).
        ``parked``: the turn gives its worker back; what is shown stays, and the resumed turn
        writes into a new message. Idempotent; never raises."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
            thread, text = self._thread, self._text
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("run %s: a live reply change is still in flight", self._run_id)
        if parked:
            try:
                self._retire(text)
            except (ChannelError, redis.RedisError) as e:
                log.warning("run %s: leaving the live reply failed: %s", self._run_id, e)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            state = self._store.load()
            self._mid, self._shown = state.get("mid"), state.get("shown", "")
            self._sent, self._blocks = state.get("sent", ""), int(state.get("blocks", 0))
            step = self._partial_step if self._mode == "partial" else self._block_step
            while step():
                pass
        except Exception:  # a preview must never break the turn; the final delivery stands
            log.exception("run %s: live reply stopped", self._run_id)

    def _nap(self, seconds: float) -> None:
        """The limiter's wait, cut short by close."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed, seconds)

    def _partial_step(self) -> bool:
        with self._cond:
            while True:
                if self._closed:
                    return False
                text = self._text.lstrip()
                if not text or text == self._last:
                    self._cond.wait()
                    continue
                since = self._since if self._since is not None else self._clock()
                wait = since + self._first_after - self._clock()
                if wait <= 0:
                    break
                self._cond.wait(wait)
        self._limiter.acquire(self._channel.live_limits(self._key))
        with self._cond:  # the newest text, after the pace's wait
            if self._closed:
                return False
            text = self._last = self._text.lstrip()
        shown = self._channel.live_text(text)
        if not shown.strip() or shown == self._shown or (
                self._mid is not None and self._shown.startswith(shown)):
            return True  # nothing new to show (a resumed stream is catching up)
        if self._store.is_final():
            return False  # another worker delivered the final reply already
        return self._change(shown)

    def _change(self, shown: str) -> bool:
        try:
            if self._mid is None:
                mid = self._channel.post_live(self._key, shown)
                winner = self._store.claim(mid, shown)
                if winner != mid:  # a worker racing us posted first: keep one message
                    self._channel.delete_live(self._key, mid)
                self._mid = winner
            else:
                self._channel.edit_live(self._key, self._mid, shown)
                self._store.save(shown=shown)
            self._shown, self._failures = shown, 0
        except RateLimited as e:  # the channel blocked the limit: the next acquire waits
            log.info("run %s: live reply rate limited for %.1f s", self._run_id, e.retry_after)
        except ChannelError as e:
            self._failures += 1
            log.warning("run %s: live reply change failed (%d): %s", self._run_id,
                        self._failures, e)
            return self._failures < MAX_FAILURES
        return True

    def _block_step(self) -> bool:
        with self._cond:
            while not self._closed and not self._done and not self._ready(self._text):
                self._cond.wait()
            if self._closed:
                return False
            done = self._done.pop(0) if self._done else None
            text = self._text
        if done is not None:
            self._send_rest(done.lstrip())
            return True
        rest = text.lstrip()[len(self._sent):]
        cut = _block_end(rest)
        self._send_block(rest[:cut], self._sent + rest[:cut])
        return True

    def _ready(self, text: str) -> bool:
        text = text.lstrip()
        if not text.startswith(self._sent):
            return False  # a resumed stream that has not caught up with what was sent
        return _block_end(text[len(self._sent):]) > 0

    def _send_rest(self, text: str) -> None:
        """A finished message: what was not sent of it yet."""
        rest = text[len(self._sent):] if text.startswith(self._sent) else text
        if rest.strip():
            self._send_block(rest, "")
        elif self._sent:
            self._store.save(sent="")
            self._sent = ""

    def _send_block(self, block: str, sent: str) -> None:
        delivery_id = f"{self._run_id}:block:{self._blocks}"
        self._channel.send_text(self._key, block.strip(), delivery_id=delivery_id)
        self._blocks += 1
        self._sent = sent
        self._store.save(sent=sent, blocks=str(self._blocks))

    def _retire(self, text: str) -> None:
        if self._mode == "block":
            if text.strip():
                self._send_rest(text.lstrip())
            return
        if self._mid is not None and text.strip():
            self._channel.finish_live(self._key, self._mid, text.strip(),
                                      delivery_id=f"{self._run_id}:live:{self._mid}")
        self._store.retire()


def _block_end(rest: str) -> int:
    """Where the sendable part of ``rest`` ends: after its last paragraph break outside a code
    block, if at least :data:`BLOCK_MIN_CHARS` come before it; else 0."""
    at = len(rest)
    while (at := rest.rfind("\n\n", 0, at)) >= BLOCK_MIN_CHARS:
        if len(_FENCE.findall(rest, 0, at)) % 2 == 0:
            return at + 2
    return 0
