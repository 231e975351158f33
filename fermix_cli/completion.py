"""``fermix completion bash|zsh|fish``: the shell's completion script for ``fermix``.

The script (argcomplete's) asks ``fermix`` itself what completes the line: the shell runs it
with ``_ARGCOMPLETE=1``, ``COMP_LINE`` and ``COMP_POINT`` set, and :func:`complete` answers
from the real parser (every command, subcommand and flag, and the choices of a flag) before
anything else runs. Install it once per shell::

    eval "$(fermix completion bash)"        # in ~/.bashrc
    eval "$(fermix completion zsh)"         # in ~/.zshrc, after compinit
    fermix completion fish > ~/.config/fish/completions/fermix.fish

A shell other than these three exits 2 with a sentence.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from fermix_shared.errors import ConfigError

SHELLS = ("bash", "zsh", "fish")
# Set by the completion script when it asks for completions (argcomplete's protocol).
ASKING = "_ARGCOMPLETE"


def asking() -> bool:
    """Whether this process was started by a shell asking for completions."""
    return ASKING in os.environ


def complete(build: Callable[[], argparse.ArgumentParser]) -> None:
    """Answer the shell's question from the parser ``build`` makes, and exit; nothing when no
    shell is asking (argcomplete's ``autocomplete`` is a no-op then)."""
    if not asking():
        return
    import argcomplete

    argcomplete.autocomplete(build())


def _completion(a: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    if a.shell not in SHELLS:
        raise ConfigError(f"there is no completion for the shell {a.shell!r}; "
                          f"`fermix completion` knows {', '.join(SHELLS[:-1])} and {SHELLS[-1]}")
    print(shellcode(["fermix"], shell=a.shell), end="")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``completion`` on the ``fermix`` parser."""
    c = sub.add_parser("completion", help="print the shell completion script (bash, zsh, fish)",
                       description="Print the completion script of SHELL; see docs/cli.md.")
    shell = c.add_argument("shell", metavar="SHELL", help="bash, zsh or fish")
    shell.completer = lambda **_: SHELLS  # type: ignore[attr-defined]
    c.set_defaults(func=_completion)
