"""Loads the ``.lua`` files that sit next to the stores."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def lua(name: str) -> str:
    return (Path(__file__).parent / f"{name}.lua").read_text()
