"""The tool calls of a run, shown while ``fermix agent`` streams its reply.

The run's ``tool`` events (fermix_shared/run_events.py: ``phase`` ``start``, ``update`` or
``result``, with ``name`` and ``callId``; ``args`` and ``result`` only when the run is verbose)
become one line on stderr as each call starts and one as it ends, so stdout stays the reply:

    → web_fetch(url='https://example.com')
      ✓ web_fetch 0.42 s

dim, and the end green or red, on a terminal; plain when stderr is piped
(``tool web_fetch(url='https://example.com')`` / ``tool web_fetch ok 0.42 s``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from fermix_cli.output import Text, console_for

if TYPE_CHECKING:
    import redis

# A call's arguments are cut to this (a line, not the whole document the model passed).
ARGS_WIDTH = 80
# How long a read of a local run's events waits before it looks whether the run is over.
FOLLOW_BLOCK_MS = 200


def summary(args: object) -> str:
    """``key=value, ...`` of a call's arguments on one line, cut to ``ARGS_WIDTH``."""
    if isinstance(args, dict):
        text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    else:
        text = "" if args is None else repr(args)
    text = " ".join(text.split())
    return text if len(text) <= ARGS_WIDTH else text[:ARGS_WIDTH - 1] + "…"


class ToolLines:
    """Writes a run's tool events to ``err`` as they come (see the module docstring); the
    calls seen are kept in :attr:`calls` (``fermix agent --json`` prints them)."""

    def __init__(self, err: TextIO):
        self._console = console_for(err)
        self._err = err
        self._started: dict[str, float] = {}
        self.calls: list[dict[str, Any]] = []

    @property
    def on_terminal(self) -> bool:
        """Whether the lines go to a terminal (styled)."""
        return self._console is not None

    def event(self, data: dict[str, Any]) -> None:
        """Show one ``tool`` event (an ``update`` says nothing: a start and an end do)."""
        name, call_id = str(data.get("name", "?")), str(data.get("callId", ""))
        if data.get("phase") == "start":
            self._started[call_id] = time.monotonic()
            self.calls.append({"name": name, "callId": call_id, "args": data.get("args"),
                               "isError": None, "result": None})
            args = f"({summary(data['args'])})" if "args" in data else ""
            self._write(f"→ {name}{args}", f"tool {name}{args}", "dim")
        elif data.get("phase") == "result":
            failed = bool(data.get("isError"))
            took = time.monotonic() - self._started.pop(call_id, time.monotonic())
            for call in self.calls:
                if call["callId"] == call_id:
                    call.update(isError=failed, result=data.get("result"))
            word = "failed" if failed else "ok"
            self._write(f"  {'✗' if failed else '✓'} {name} {word}, {took:.2f} s",
                        f"tool {name} {word} {took:.2f} s", "red" if failed else "green")

    def _write(self, styled: str, plain: str, style: str) -> None:
        if self._console is not None:
            self._console.print(Text(styled, style=style))
        else:
            self._err.write(plain + "\n")
            self._err.flush()


def follow(r: redis.Redis, run_id: str, lines: ToolLines) -> Callable[[], None]:
    """Show the tool events of ``run_id`` from its Redis stream as they come, in a daemon
    thread (``fermix agent --local``, whose turn runs in the calling thread); returns the
    function that stops it, once what was written so far has been shown."""
    from fermix_shared import keys

    done = threading.Event()

    def tail() -> None:
        import redis

        try:
            _tail()
        except redis.RedisError:
            return  # the turn reports what it can: these lines are extra

    def _tail() -> None:
        key, last = keys.run_events(run_id), "0-0"
        while True:
            finished = done.is_set()  # then one more read, without waiting: the rest
            batches: Any = r.xread({key: last}, count=500,
                                   block=None if finished else FOLLOW_BLOCK_MS) or []
            for _name, entries in batches:
                for entry_id, fields in entries:
                    last = entry_id
                    if fields.get("stream") == "tool":
                        lines.event(json.loads(fields["data"]))
            if finished and not batches:
                return

    thread = threading.Thread(target=tail, name="fermix-agent-tools", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join(FOLLOW_BLOCK_MS / 1000 + 5)

    return stop
