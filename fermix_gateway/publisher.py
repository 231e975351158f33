"""TaskPublisher: the gateway's Celery tasks are published by one thread, off the request path.

Everything the gateway enqueues (a dispatch for a conversation, a reply into a chat, an
approval's resume) is a hint about state that is already durable in Redis: the reaper
dispatches a queued conversation whose kick was lost. So a request does not wait for the
broker. :meth:`TaskPublisher.send` only puts the task on an in-process queue and returns; one
thread, holding one kombu producer (one broker connection), publishes what has queued up, in
order. This replaced a thread hop per message (``anyio.to_thread`` around ``send_task``), which
profiled at about a third of the gateway's CPU: a pool thread woken per message, a broker
connection taken from the pool per thread, and a loop wake-up to return.

A dispatch for a conversation that already has one waiting to be published is not queued
twice: a dispatch names only the conversation and takes whatever is at its head.

Failures are logged and dropped (the state they point at is durable); :meth:`close` publishes
what is still queued, for up to ``timeout`` seconds, when the gateway stops.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

from celery import Celery

from fermix_shared import tracing
from fermix_shared.task_names import DISPATCH_TASK

log = logging.getLogger(__name__)

_STOP = object()


class TaskPublisher:
    def __init__(self, celery: Celery):
        self._celery = celery
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending_dispatch: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fermix-task-publisher",
                                        daemon=True)
        self._thread.start()

    def send(self, name: str, args: list[str]) -> None:
        """Queue ``name(*args)`` for publishing; never blocks, never raises."""
        if name == DISPATCH_TASK:
            with self._lock:
                if args[0] in self._pending_dispatch:
                    return
                self._pending_dispatch.add(args[0])
        # With tracing on, the request's span context and when it was queued: the publish is
        # a span of the request's trace (fermix.publish), made once the broker has it.
        traced = tracing.inject()
        self._queue.put((name, args, traced, time.time_ns() if traced else 0))

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued (up to ``timeout`` s), then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("task publisher: %d task(s) not published at shutdown (the reaper "
                        "dispatches queued conversations)", self._queue.qsize())

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                with self._celery.producer_or_acquire() as producer:
                    while item is not None:
                        if item is _STOP:
                            return
                        self._publish(producer, *item)
                        item = self._next()
            except Exception:  # logged in _publish; the next item gets a fresh producer
                continue

    def _next(self) -> Any:
        with contextlib.suppress(queue.Empty):
            return self._queue.get_nowait()
        return None

    def _publish(self, producer: Any, name: str, args: list[str],
                 traced: tracing.Carrier | None = None, queued_ns: int = 0) -> None:
        if name == DISPATCH_TASK:
            with self._lock:
                self._pending_dispatch.discard(args[0])
        try:
            # ignore_result: else Celery's Redis backend SUBSCRIBEs to (and later leaves) a
            # result channel per task sent by name, a result nobody here reads.
            self._celery.send_task(name, args=args, producer=producer, ignore_result=True)
            if traced:
                tracing.past_span(traced, "fermix.publish", queued_ns,
                                  attributes={"fermix.task": name})
        except Exception:
            # The state this task points at is durable; the reaper picks it up. The producer
            # may be broken: the loop takes a fresh one.
            log.exception("could not enqueue %s", name)
            raise
