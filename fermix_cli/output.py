"""How the ``fermix`` commands print, in three modes:

- **a terminal** (a person reading): tables and colour, through rich;
- **a pipe or a file**: the plain lines each command always printed, unchanged, for scripts;
- **``--json``**: one JSON document on stdout, whatever stdout is. An action (pause, kill,
  rm, ...) prints what it changed: the gateway's answer, or ``{"ok": true, ...}`` naming it
  (:func:`add_json_flag`, :func:`done`).

Progress (a spinner, a bar, what is being done) goes to stderr, and only when stderr is a
terminal: stdout, and anything piped, never carries it.

A stream is a terminal as rich detects it, with the common conventions: ``FORCE_COLOR`` set
and not empty makes any stream one, ``NO_COLOR`` keeps the tables and drops the colour, and
``TERM=dumb`` (or ``unknown``) gets the plain lines and no progress. rich's own
``TTY_COMPATIBLE=0|1`` and ``TTY_INTERACTIVE=0|1`` apply too.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TextIO, TypeVar

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

# The colour of a state, level or outcome wherever a table shows one (lowercase keys).
_STATE_STYLES = {
    "ok": "green", "pass": "green", "active": "green", "scheduled": "green",
    "warn": "yellow", "paused": "yellow", "not run": "yellow", "queued": "yellow",
    "running": "cyan", "idle": "dim", "created": "dim",
    "fail": "bold red", "error": "red", "killed": "red", "disabled": "red", "stopped": "red",
    "denied": "red", "refused": "red", "blocked": "red", "timeout": "red",
}

__all__ = ["Cell", "Console", "Steps", "Text", "add_json_flag", "console_for", "done",
           "print_json", "state", "steps", "table", "terminal"]

Cell = str | Text
T = TypeVar("T")


def console_for(stream: TextIO) -> Console | None:
    """A rich Console on ``stream`` when a person reads it (see the module docstring), else
    None."""
    console = Console(file=stream, highlight=False)
    return console if console.is_terminal and not console.is_dumb_terminal else None


def terminal() -> Console | None:
    """A rich Console on stdout when a person reads it (see the module docstring), else None:
    print the plain lines then."""
    return console_for(sys.stdout)


def state(value: str) -> Text:
    """``value`` coloured by what it says (``ok`` green, ``warn`` yellow, ``fail`` red, ...;
    ``active, lease expires in 9s`` as ``active``)."""
    word = value.lower()
    return Text(value, style=_STATE_STYLES.get(word) or _STATE_STYLES.get(word.split(",")[0], ""))


def table(console: Console, headers: Sequence[str], rows: Iterable[Sequence[Cell]],
          title: str | None = None, numbers: Iterable[str] = ()) -> None:
    """Print ``rows`` under ``headers`` as a table, the columns named in ``numbers`` aligned
    right. A ``str`` cell is shown as it is (never read as rich markup: data holds
    ``[brackets]``); a :class:`Text` keeps its style."""
    t = Table(title=title, box=box.SIMPLE_HEAD, header_style="bold", title_justify="left",
              title_style="bold")
    right = set(numbers)
    for header in headers:
        t.add_column(header, overflow="fold", justify="right" if header in right else "left")
    for row in rows:
        t.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in row))
    console.print(t)


def print_json(data: object, ensure_ascii: bool = True) -> None:
    """``data`` as one JSON document on stdout (indented; the ``--json`` form of a command)."""
    print(json.dumps(data, indent=2, ensure_ascii=ensure_ascii))


def add_json_flag(parser: argparse.ArgumentParser,
                  help: str = "print what changed as JSON") -> None:
    """``--json`` on an action's parser (read back by :func:`done` as ``a.json``)."""
    parser.add_argument("--json", action="store_true", help=help)


def done(a: argparse.Namespace, sentence: str, answer: Mapping[str, object] | None = None,
         **facts: object) -> None:
    """An action's result: with ``--json`` the ``answer`` (the gateway's JSON), or, when there
    is none, ``{"ok": true, **facts}``; else the ``sentence`` it always printed."""
    if getattr(a, "json", False):
        print_json(dict(answer) if answer else {"ok": True, **facts})
    else:
        print(sentence)


class Steps:
    """What a long command says while it works: a live line on stderr (spinner, what it is
    doing, a bar when the total is known) on a terminal; on a pipe, only the lines the
    command always printed (:meth:`line`)."""

    def __init__(self, progress: Progress | None, task: TaskID | None):
        self._progress, self._task = progress, task
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        """``n`` more of the total done."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def doing(self, what: str) -> None:
        """Say what is being done now."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=what)
            self._progress.refresh()

    def line(self, text: str) -> None:
        """A line that stays: above the live line on a terminal, else plain on stderr."""
        if self._progress is not None:
            self._progress.console.print(Text(text))
            return
        with self._lock:
            print(text, file=sys.stderr, flush=True)

    def expect(self, total: int) -> None:
        """The total is ``total``, none of it done yet (a bar from here on)."""
        if self._progress is not None and self._task is not None:
            self._progress.reset(self._task, total=total)

    def track(self, items: Iterable[T]) -> Iterator[T]:
        """``items`` as they come, each one advancing the count."""
        for item in items:
            yield item
            self.advance()


@contextmanager
def steps(what: str, total: int | None = None, counted: bool = False) -> Iterator[Steps]:
    """A :class:`Steps` for the block: live on stderr when it is a terminal (cleared at the
    end: the result is the command's own output), silent otherwise. A bar and a count when
    ``total`` is given, or ``counted`` (its total comes later: :meth:`Steps.expect`)."""
    console = console_for(sys.stderr)
    if console is None or not console.is_interactive:
        yield Steps(None, None)
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if counted or total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    # stdout stays the command's own: rich would otherwise send what it prints to stderr.
    progress = Progress(*columns, TimeElapsedColumn(), console=console, transient=True,
                        redirect_stdout=False)
    with progress:
        task = progress.add_task(what, total=total)
        progress.refresh()  # at once: a quick command still shows what it did
        yield Steps(progress, task)
