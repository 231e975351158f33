"""Import boundaries between the packages: ``fermix_shared`` is what the gateway and the worker
share, so it imports neither of them, nor the command line (``fermix_cli``) or the dev tooling
(``fermix_dev``); the gateway and the worker never import the command line or the dev tooling.

Imports are read with ``ast``, so a lazy import inside a function counts as much as one at the
top. Naming a module in a string (Celery's ``include``, uvicorn's app path) is not an import.

Within ``fermix_shared`` no two modules import each other, however indirectly: a cycle makes
import order matter and pushes imports into functions to dodge it. An import under
``if TYPE_CHECKING:`` never runs and does not count; importing ``a.b.c`` runs ``a.b``'s
``__init__`` too, so it counts as importing that package as well.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "fermix_shared": {"fermix_gateway", "fermix_worker", "fermix_cli", "fermix_dev"},
    "fermix_gateway": {"fermix_cli", "fermix_dev"},
    "fermix_worker": {"fermix_cli", "fermix_dev"},
}


def imported_modules(path: Path, names: bool = False) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in the file; relative ones stay in its package.
    With ``names``, also ``a.b`` for ``from a import b`` (``b`` may be a module)."""
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names if names else ():
                yield node.lineno, f"{node.module}.{alias.name}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_beyond_its_boundary(package: str) -> None:
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, f"no modules found under {package}/"
    crossings = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in modules
        for line, module in imported_modules(path)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert crossings == []


def test_the_layout_test_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from fermix_dev.procs import free_port\n"
                      "    from . import sibling\n")
    assert list(imported_modules(source)) == [(1, "os"), (4, "fermix_dev.procs")]


# Import cycles within fermix_shared that are known and out of scope, each with why; keep empty.
ALLOWED_CYCLES: list[set[str]] = []


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth (functions included) but under ``if TYPE_CHECKING:``
    (its ``else`` runs, so it counts)."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
              modules: set[str]) -> Iterator[str]:
    """The modules ``node`` names: ``from a import b`` is ``a.b`` when that is a module."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = importer.split(".")[: None if is_package else -1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    for alias in node.names:
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` its running imports load (packages' ``__init__``
    included, but not the importer's own packages: those are already loading)."""
    paths = {module_name(root, p): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps: set[str] = set()
        for node in runtime_imports(ast.parse(path.read_bytes(), str(path))):
            for target in _imported(node, name, path.name == "__init__.py", set(paths)):
                parts = target.split(".")
                deps.update(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                            if ".".join(parts[:i]) in paths
                            and not f"{name}.".startswith(".".join(parts[:i]) + "."))
        graph[name] = deps - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (each sorted, once)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set[str](), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen
    found = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}
    return sorted((set(c) for c in found), key=sorted)


def test_fermix_shared_has_no_import_cycle() -> None:
    graph = import_graph(ROOT, "fermix_shared")
    assert len(graph) > 50, "the import graph found too few modules"
    cycles = [c for c in import_cycles(graph) if c not in ALLOWED_CYCLES]
    described = [{m: sorted(graph[m] & c) for m in sorted(c)} for c in cycles]
    assert described == []


def test_the_cycle_test_sees_function_imports_and_skips_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import c\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nimport pkg.a\n"
                              "if TYPE_CHECKING:\n    from pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text("from pkg.a import f\n")
    (pkg / "d.py").write_text("from pkg.sub.c import f\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub", "pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}  # not its own package
    assert import_cycles(graph) == [{"pkg.a", "pkg.b"}]


# -- the rooms inside the packages ------------------------------------------------------------

def _modules_under(prefix: str) -> list[Path]:
    """The product modules of ``prefix`` (a package, or a module without ``.py``)."""
    path = ROOT / prefix.replace(".", "/")
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


TASK_NAME = re.compile(r"fermix\.(conversation|channel|subagents|approvals|schedule|memory)\.\w+")

# (rooms, rooms they never import), each with why
ROOMS_NEVER = [
    # The fleet's housekeeping knows no feature: each registers its sweep (fleet/sweeper.py).
    (["fermix_worker.fleet"],
     ["fermix_worker.approvals", "fermix_worker.memory", "fermix_worker.usage",
      "fermix_worker.scheduling", "fermix_shared.approvals", "fermix_shared.memory",
      "fermix_shared.audit", "fermix_shared.usage", "fermix_shared.scheduling"]),
    # The loop is a state machine over a model and tools: no Redis, no Celery, no stores, no
    # audit or usage (its caller's RunContext and metered router carry those through it).
    (["fermix_worker.loop", "fermix_worker.guard"],
     ["redis", "celery", "kombu", "fermix_shared.redis", "fermix_shared.stores",
      "fermix_shared.keys", "fermix_shared.lua", "fermix_shared.audit", "fermix_shared.usage",
      "fermix_worker.usage", "fermix_worker.turn", "fermix_worker.fleet"]),
    # Redis plumbing carries no feature.
    (["fermix_shared.redis"],
     ["fermix_shared.agents", "fermix_shared.approvals", "fermix_shared.audit",
      "fermix_shared.memory", "fermix_shared.usage", "fermix_shared.scheduling",
      "fermix_shared.skills", "fermix_shared.channels", "fermix_shared.stores"]),
    # The /v1 API and the platforms' webhooks are two doors: neither goes through the other.
    (["fermix_gateway.api"], ["fermix_gateway.webhooks"]),
    (["fermix_gateway.webhooks"], ["fermix_gateway.api"]),
]

# Who may import the process's wiring: only the process's entry points.
ENTRY_ONLY = {
    "fermix_worker.tasks": ["fermix_worker.tasks"],
    "fermix_worker.runtime": ["fermix_worker.tasks", "fermix_worker.bootstep",
                              "fermix_cli.local"],
}


@pytest.mark.parametrize(("rooms", "never"), ROOMS_NEVER, ids=lambda v: ",".join(v))
def test_a_room_imports_nothing_it_must_not_know(rooms: list[str], never: list[str]) -> None:
    crossings = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for room in rooms for path in _modules_under(room)
        for line, module in imported_modules(path, names=True) if _under(module, never)
    ]
    assert crossings == []


@pytest.mark.parametrize("wiring", sorted(ENTRY_ONLY))
def test_the_worker_is_wired_by_its_entry_points_alone(wiring: str) -> None:
    allowed = ENTRY_ONLY[wiring]
    crossings = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for package in FORBIDDEN for path in sorted((ROOT / package).rglob("*.py"))
        if not _under(_dotted(path), allowed)
        for line, module in imported_modules(path, names=True) if _under(module, [wiring])
    ]
    assert crossings == []


def test_every_task_is_named_in_one_module() -> None:
    """Task names are defined in fermix_shared/task_names.py alone: a name written anywhere
    else could drift from the one Flower and ``send_task`` use."""
    strays = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for package in FORBIDDEN for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "fermix_shared" / "task_names.py"
        for node in ast.walk(ast.parse(path.read_bytes()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and TASK_NAME.fullmatch(node.value)
    ]
    assert strays == []
