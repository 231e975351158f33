"""The ``fleet`` mark, given automatically: a test that starts processes (a stack of gateway and
workers, a ``fermix`` command, any subprocess) is a fleet test, so ``pytest -m "not fleet"``
runs the rest in seconds.

A test is ``fleet`` when its own code, a fixture in its closure, or a helper in ``tests/`` that
either calls names one of ``PROCESS_STARTERS``. A private ``redis-server`` (``start_redis``) is
cheap and does not count, nor does the in-process scripted LLM server.

Under that, a net: an unmarked test whose setup or body spawns anything but a ``redis-server``
fails there, naming the program, so a test the reading above misses cannot slip into the fast
set. Registered from ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

PROCESS_STARTERS = frozenset({"start_stack", "Managed", "subprocess"})
CHEAP_PROGRAMS = frozenset({"redis-server"})


class UnmarkedFleetTest(RuntimeError):
    """An Exception, not a pytest outcome, so the fixture's own cleanup still runs."""


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # lambdas and nested functions
            yield from _codes(const)


def starts_processes(func: Callable[..., Any], seen: set[Any] | None = None) -> bool:
    """Whether ``func``, or a function of ``tests/`` it names, names a process starter."""
    seen = set() if seen is None else seen
    func = inspect.unwrap(func)
    if func in seen or not inspect.isfunction(func):
        return False
    seen.add(func)
    for code in _codes(func.__code__):
        if PROCESS_STARTERS.intersection(code.co_names):
            return True
        for name in code.co_names:
            helper = func.__globals__.get(name)
            if (inspect.isfunction(helper) and helper.__module__.startswith("tests.")
                    and starts_processes(helper, seen)):
                return True
    return False


def _is_fleet(item: pytest.Function) -> bool:
    # pytest has no public view of an item's fixture closure with the fixtures' functions.
    fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
    return any(starts_processes(f) for f in [item.function, *fixtures])


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (isinstance(item, pytest.Function) and item.get_closest_marker("fleet") is None
                and _is_fleet(item)):
            item.add_marker(pytest.mark.fleet)


_unmarked: str | None = None  # the node id of an unmarked test in its setup or call


def _refuse_unmarked_spawns(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or _unmarked is None:
        return
    program = os.path.basename(os.fsdecode(args[0]))
    if program not in CHEAP_PROGRAMS:
        raise UnmarkedFleetTest(
            f"{_unmarked} starts a process ({program}) but is not marked fleet: mark it "
            "`@pytest.mark.fleet`, or name the starter in tests/fleet_marks.py PROCESS_STARTERS"
        )


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_refuse_unmarked_spawns)


@contextlib.contextmanager
def _guard(item: pytest.Item) -> Iterator[None]:
    global _unmarked
    _unmarked = None if item.get_closest_marker("fleet") else item.nodeid
    try:
        yield
    finally:
        _unmarked = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _guard(item):
        return (yield)
