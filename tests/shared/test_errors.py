"""Every exception Fermix defines is a FermixError, drawn where it is in errors.py's tree.

Imports every module of the four product packages (fermix_dev is dev tooling, not the product:
its one exception is drawn outside the tree and not walked here) and checks each exception
class it defines against the drawing: there, under its first base, with its other bases in
brackets and the module that defines it on its line.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

from fermix_shared import errors
from fermix_shared.errors import FermixError

PACKAGES = ("fermix_shared", "fermix_worker", "fermix_gateway", "fermix_cli")

# Exceptions that are not FermixErrors, on purpose (each is drawn under "Outside the tree").
OUTSIDE = {
    # A BaseException thrown into a blocked greenlet: it must pass the `except Exception` of the
    # code it interrupts, which no FermixError (an Exception) would.
    "fermix_worker.interrupt.Interrupted",
}

# "    FermixError", "     |    +-- BadRequest [ValueError]    gateway.api.openai_schemas"
ENTRY = re.compile(r"^(?P<lead> {4}|[ |]*\+-- )(?P<name>_?[A-Z]\w*)(?: \[(?P<bases>[\w, ]+)\])?")


def _exceptions() -> list[type[BaseException]]:
    found = []
    for root in PACKAGES:
        package = importlib.import_module(root)
        names = [root] + [m.name for m in pkgutil.walk_packages(package.__path__, f"{root}.")]
        for name in names:
            if name.rsplit(".", 1)[-1] == "__main__":  # runs the command when imported
                continue
            module = importlib.import_module(name)
            found += [value for value in vars(module).values()
                      if inspect.isclass(value) and issubclass(value, BaseException)
                      and value.__module__ == name]
    return found


EXCEPTIONS = _exceptions()


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _drawing() -> dict[str, tuple[str, str | None, str]]:
    """Each drawn name -> (its line, its drawn parent or None, the brackets' text)."""
    doc = errors.__doc__ or ""
    drawn: dict[str, tuple[str, str | None, str]] = {}
    by_column: dict[int, str] = {}  # the last entry drawn at each column
    for line in doc.splitlines():
        match = ENTRY.match(line)
        if match is None:
            continue
        column = len(match["lead"])
        name = match["name"]
        assert name not in drawn, f"{name} is drawn twice"
        drawn[name] = (line, by_column.get(column - 5), match["bases"] or "")
        by_column[column] = name
    return drawn


def test_the_walk_finds_the_exceptions() -> None:
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"FermixError", "ToolError", "ChannelError", "BodyTooLarge", "Interrupted"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=_qualified)
def test_every_exception_is_a_fermix_error(cls: type[BaseException]) -> None:
    if _qualified(cls) in OUTSIDE:
        assert not issubclass(cls, FermixError)
    else:
        assert issubclass(cls, FermixError), f"{_qualified(cls)} is not under FermixError"


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=_qualified)
def test_every_exception_is_drawn_where_it_is(cls: type[BaseException]) -> None:
    drawn = _drawing()
    assert cls.__name__ in drawn, f"{_qualified(cls)} is not drawn in errors.py's docstring"
    line, parent, brackets = drawn[cls.__name__]
    if cls.__module__ != errors.__name__:
        assert cls.__module__.removeprefix("fermix_") in line, f"{line!r}: not its module"
    if _qualified(cls) in OUTSIDE or cls is FermixError:
        return
    first, *others = cls.__bases__
    assert parent == first.__name__, f"{cls.__name__} is drawn under {parent}"
    for base in others:
        assert base.__name__ in brackets, f"{line!r}: the second base {base.__name__} is missing"


def test_nothing_is_drawn_that_does_not_exist() -> None:
    defined = {cls.__name__ for cls in EXCEPTIONS} | {"ScriptedConnectionDrop"}  # fermix_dev's
    assert set(_drawing()) == defined
