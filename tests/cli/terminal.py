"""``fermix`` run as a person at a terminal runs it: one of its streams on a pseudo-terminal
(``pty``), the other piped; and the same command piped, as a script runs it."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from dataclasses import dataclass
from typing import Literal

# The environment that would make rich decide for the test (set by a CI, or a developer).
DECIDING = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def clean_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """``env`` without the variables that would decide what a terminal is, plus ``extra``."""
    return {**{k: v for k, v in env.items() if k not in DECIDING}, "TERM": "xterm-256color",
            **extra}


class Running:
    """A ``fermix`` process started by :func:`start`; :meth:`wait` for what it wrote."""

    def __init__(self, env: dict[str, str], args: tuple[str, ...],
                 tty: Literal["stdout", "stderr", None]):
        self._tty, self._master = tty, -1
        self._chunks: list[bytes] = []
        argv = [sys.executable, "-m", "fermix_cli", *args]
        if tty is None:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            return
        self._master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        streams = {name: slave if name == tty else subprocess.PIPE
                   for name in ("stdout", "stderr")}
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **streams)
        os.close(slave)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        """Until every end of the terminal is closed: the process is done."""
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:
                return
            if not data:
                return
            self._chunks.append(data)

    def wait(self, timeout: float = 60) -> Ran:
        """Its exit code, stdout and stderr (a terminal's ``\\r\\n`` made ``\\n``)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
            if self._tty is not None:
                self._reader.join(timeout)
        finally:
            self.proc.kill()
            if self._tty is not None:
                os.close(self._master)
        seen = b"".join(self._chunks).decode("utf-8", "replace").replace("\r\n", "\n")
        got = {"stdout": (out or b"").decode(), "stderr": (err or b"").decode()}
        if self._tty is not None:
            got[self._tty] = seen
        return Ran(self.proc.returncode, got["stdout"], got["stderr"])


def start(env: dict[str, str], *args: str,
          tty: Literal["stdout", "stderr", None] = None) -> Running:
    """Start ``fermix ARGS``; ``tty`` names the stream that is a 160-column terminal, the
    others are piped."""
    return Running(env, args, tty)


def fermix(env: dict[str, str], *args: str, tty: Literal["stdout", "stderr", None] = None,
           timeout: float = 60) -> Ran:
    """``fermix ARGS`` to its end (see :func:`start`)."""
    return start(env, *args, tty=tty).wait(timeout)


def plain(text: str) -> str:
    """``text`` without its terminal escapes (colours, cursor moves)."""
    return ANSI.sub("", text)
