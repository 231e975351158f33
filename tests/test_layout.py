"""Import boundaries between the packages: ``fermix_shared`` is what the gateway and the worker
share, so it imports neither of them, nor the command line (``fermix_cli``) or the dev tooling
(``fermix_dev``); the gateway and the worker never import the command line or the dev tooling.

Imports are read with ``ast``, so a lazy import inside a function counts as much as one at the
top. Naming a module in a string (Celery's ``include``, uvicorn's app path) is not an import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "fermix_shared": {"fermix_gateway", "fermix_worker", "fermix_cli", "fermix_dev"},
    "fermix_gateway": {"fermix_cli", "fermix_dev"},
    "fermix_worker": {"fermix_cli", "fermix_dev"},
}


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in the file; relative ones stay in its package."""
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


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
