"""The lock (requirements/, written by scripts/lock.sh) against pyproject.toml and this venv:
every requirement is pinned at a release its range admits, with hashes; the image's runtime lock
is the dev lock's releases without the dev tools; and the venv the tests run in holds exactly the
locked releases (scripts/_venv.sh installed the lock, not whatever is newest today).

Offline: nothing here asks a registry (``bash scripts/lock.sh --check`` does, to find a lock
that is out of date with the registry's metadata)."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@dataclass(frozen=True)
class Pin:
    version: Version
    marker: Marker | None
    hashes: int


def pins(name: str) -> dict[str, Pin]:
    """The lock file's pins by canonical name (a name pinned twice under exclusive markers
    keeps its last; none of ours is)."""
    text = (ROOT / "requirements" / Path(name).name).read_text()
    found: dict[str, Pin] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        head = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)(?:\s*;\s*([^\\\n]+))?", block)
        if head:
            marker = Marker(head[3].strip()) if head[3] else None
            found[canonicalize_name(head[1])] = Pin(Version(head[2]), marker,
                                                    block.count("--hash=sha256:"))
    return found


DEV = pins("dev.txt")
RUNTIME = pins("runtime.txt")


def requirements(*, dev: bool) -> list[Requirement]:
    listed = PROJECT["dependencies"] + (PROJECT["optional-dependencies"]["dev"] if dev else [])
    return [Requirement(r) for r in listed]


@pytest.mark.parametrize("dev", [True, False], ids=["dev.txt", "runtime.txt"])
def test_every_requirement_is_pinned_at_a_release_its_range_admits(dev: bool) -> None:
    lock = DEV if dev else RUNTIME
    wrong = []
    for req in requirements(dev=dev):
        pin = lock.get(canonicalize_name(req.name))
        if pin is None or not req.specifier.contains(pin.version, prereleases=True):
            wrong.append(f"{req} -> {pin.version if pin else 'not pinned'}")
    assert wrong == [], "the lock is out of date with pyproject.toml: run bash scripts/lock.sh"


def test_every_pin_carries_hashes_so_an_install_checks_what_it_downloads() -> None:
    assert len(DEV) > 100 and len(RUNTIME) > 80
    assert [n for n, p in {**DEV, **RUNTIME}.items() if p.hashes == 0] == []


def test_the_image_lock_is_the_dev_lock_without_the_dev_tools() -> None:
    assert {n: p.version for n, p in RUNTIME.items()} == {
        n: DEV[n].version for n in RUNTIME}
    dev_only = {canonicalize_name(r.name) for r in requirements(dev=True)} - {
        canonicalize_name(r.name) for r in requirements(dev=False)}
    assert dev_only >= {"pytest", "mypy", "ruff"} and dev_only.isdisjoint(RUNTIME)


def test_this_venv_holds_the_locked_releases() -> None:
    """What applies on this platform is installed, at the locked release (a package installed
    beside the lock by hand, or an install that resolved afresh, shows here). The lock is the
    one this venv was made from: scripts/test-minimum.sh names requirements/minimum.txt."""
    wrong = []
    for name, pin in pins(os.environ.get("FERMIX_LOCK", "dev.txt")).items():
        if pin.marker is not None and not pin.marker.evaluate():
            continue
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            wrong.append(f"{name}: not installed")
            continue
        if installed != pin.version:
            wrong.append(f"{name}: {installed} installed, {pin.version} locked")
    assert wrong == []
