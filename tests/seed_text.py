"""The seed pages' own words, for tests that assert a behaviour the seeds describe.

The three pages in ``tests/seeds/`` are verbatim copies of the reference pages (Fermix's agent
loop, Fased's agent loop, OpenFang's agent lifecycle). A test that checks a user-facing message
compares it with :func:`quoted`, which fails unless the phrase is in the seed, so a drift
between the code's constant and the seed's words can fail a test (comparing the message with the
code's own constant never could).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

PAGES = {
    "F": "fermix-agent-loop.txt",
    "S": "fased-agent-loop.txt",
    "O": "openfang-agent-lifecycle.txt",
}
SEEDS = Path(__file__).parent / "seeds"


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@cache
def seed_text(page: str) -> str:
    """The page (``"F"``, ``"S"`` or ``"O"``) with runs of whitespace as one space."""
    return _flat((SEEDS / PAGES[page]).read_text(encoding="utf-8"))


def quoted(page: str, phrase: str) -> str:
    """``phrase``, after checking that the seed page says it word for word (whitespace aside)."""
    flat = _flat(phrase)
    assert flat in seed_text(page), f"the {PAGES[page]} seed does not say: {flat!r}"
    return flat
