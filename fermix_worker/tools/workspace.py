"""The workspace: the one directory a turn's file tools and commands may touch.

A turn's root is its agent's ``workspace``, else the ``workspace`` setting (neither set: the
tools are not offered); with ``workspace_per_conversation`` it is a subdirectory of that per
conversation, so chats do not see each other's files (a scheduled run uses the folder of the
chat it delivers to, else its job's). Every worker may run any turn, so on a fleet of several
hosts the workspace must be shared storage.

Confinement: a path the model names (relative to the root, or absolute) is resolved, ``..`` and
symlinks included, and refused unless it lands inside the root; a symlink in the root that
points out is refused like any other outside path. The file is then opened one directory at a
time from the root with ``O_NOFOLLOW``, so a symlink that appears in between (a command running
in the same workspace) fails the call instead of leading it outside. Only regular files are read
or written (a FIFO or a device would block or leak).

A subagent has no turn: it reads its parent turn's workspace, resolved when the fan-out started
(:func:`run_workspace`), and never writes it (``Workspace.read_only``; its commands see it
read-only too).

The file tools (read, write, edit, list, search) are in :mod:`fermix_worker.tools.files`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from fermix_shared.agents.definitions import turn_agent
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from fermix_worker.tools.base import ToolError
from fermix_worker.tools.context import RunContext, TurnContext

# A per-conversation folder name: readable, bounded, and unique through a hash of the full key.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
READ_ONLY = "the workspace is read-only here: a subagent cannot write local state"


def workspace_configured(settings: Settings) -> bool:
    """True when the setting or any agent names a workspace (the tools are offered then)."""
    return settings.workspace is not None or any(a.workspace for a in settings.agents)


def conversation_dir(key: ConversationKey) -> str:
    """The folder of one conversation inside a per-conversation workspace."""
    readable = _UNSAFE.sub("_", f"{key.channel}-{key.chat_id}-{key.thread_scope}")[:80]
    digest = hashlib.sha256(key.as_str().encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


@dataclass(frozen=True)
class Workspace:
    """One resolved root directory and the paths inside it; ``read_only``: nothing in it may
    be opened for writing (a subagent's view of its parent's workspace)."""

    root: Path
    read_only: bool = False

    def resolve(self, raw: object) -> Path:
        """The real path ``raw`` names, refused with a :class:`ToolError` unless it is the root
        or inside it."""
        if not isinstance(raw, str) or not raw.strip() or "\0" in raw:
            raise ToolError("path must be a non-empty string (relative to the workspace)")
        path = Path(raw.strip())
        real = Path(os.path.realpath(path if path.is_absolute() else self.root / path))
        if real != self.root and not real.is_relative_to(self.root):
            raise ToolError(f"{raw!r} is outside the workspace; use paths inside it")
        return real

    def rel(self, path: Path) -> str:
        """``path`` as the model should name it: relative to the root (``.`` for the root)."""
        return path.relative_to(self.root).as_posix() or "."

    def open(self, path: Path, flags: int, *, make_parents: bool = False) -> int:
        """A descriptor of the regular file ``path`` (resolved, inside the root), opened with
        ``flags`` by walking from the root without following any symlink."""
        parts = path.relative_to(self.root).parts
        if self.read_only and flags & _WRITE_FLAGS:
            raise ToolError(READ_ONLY)
        if not parts:
            raise ToolError("the workspace root is a directory, not a file")
        name = self.rel(path)
        fd = -1
        try:
            fd = os.open(self.root, _DIR_FLAGS)
            for part in parts[:-1]:
                if make_parents:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                parent, fd = fd, _open_dir(part, fd)
                os.close(parent)
            # O_NONBLOCK: opening a FIFO must not hang the worker (it is refused just below).
            out = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                          0o644, dir_fd=fd)
        except OSError as e:
            raise os_error(e, name) from e
        finally:
            if fd >= 0:
                os.close(fd)
        mode = os.fstat(out).st_mode
        if not stat.S_ISREG(mode):
            os.close(out)
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ToolError(f"{name} is {kind}")
        os.set_blocking(out, True)
        return out


def _open_dir(name: str, parent: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except NotADirectoryError:
        # O_DIRECTORY reports a symlink as "not a directory": tell the two apart.
        if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def os_error(e: OSError, name: str) -> ToolError:
    """An OS error on ``name`` as the model should read it."""
    if isinstance(e, FileNotFoundError):
        return ToolError(f"{name} does not exist")
    if isinstance(e, IsADirectoryError):
        return ToolError(f"{name} is a directory")
    if isinstance(e, NotADirectoryError):
        return ToolError(f"a parent of {name} is not a directory")
    if e.errno == errno.ELOOP:
        return ToolError(f"{name} changed while in use (a symlink appeared on its path)")
    if isinstance(e, PermissionError):
        return ToolError(f"permission denied: {name}")
    return ToolError(f"{name}: {e.strerror or e}")


def turn_workspace(settings: Settings, turn: TurnContext | None) -> Workspace:
    """The calling turn's workspace (``turn``: the call's context's), created if missing."""
    if turn is None:
        raise ToolError("the workspace is only available inside a conversation's turn")
    base = turn_agent(settings.agents, turn.agent).workspace or settings.workspace
    if base is None:
        raise ToolError(f"agent {turn.agent!r} has no workspace")
    base = base.expanduser()
    if settings.workspace_per_conversation:
        base = base / conversation_dir(_conversation(turn))
    try:
        base.mkdir(parents=True, exist_ok=True)
        return Workspace(base.resolve(strict=True))
    except OSError as e:
        raise ToolError(f"the workspace cannot be opened: {e.strerror or e}") from e


def run_workspace(settings: Settings, ctx: RunContext) -> Workspace:
    """The workspace a tool call may use: its turn's (:func:`turn_workspace`), or in a
    subagent its parent turn's, read-only."""
    sub = ctx.subagent
    if ctx.turn is not None or sub is None:
        return turn_workspace(settings, ctx.turn)
    if sub.workspace is None:
        raise ToolError("there is no workspace here: the turn that started this subagent has none")
    try:
        return Workspace(Path(sub.workspace).resolve(strict=True), read_only=True)
    except OSError as e:
        raise ToolError(f"the workspace cannot be opened: {e.strerror or e}") from e


def workspace_root(settings: Settings, turn: TurnContext) -> str | None:
    """``turn``'s workspace root (created if missing), or None when it has none (a fan-out
    resolves it for its subagents, which read it)."""
    try:
        return str(turn_workspace(settings, turn).root)
    except ToolError:
        return None


def _conversation(turn: TurnContext) -> ConversationKey:
    """Whose folder a turn uses: its conversation's; a scheduled run (a new key each run) uses
    the chat it delivers to, else one folder per job."""
    if turn.key.channel != "schedule":
        return turn.key
    return turn.deliver_to or ConversationKey(channel="schedule", chat_id=turn.key.chat_id)
