"""A remembered fact: the stored record, its limits, and the text rules behind
de-duplication."""

from __future__ import annotations

from typing import Literal

from fermix_shared.errors import UserInputError
from fermix_shared.records import VersionedRecord

SCHEMA_VERSION = 1
MAX_ACTIVE_FACTS = 500
MAX_ARCHIVED_FACTS = 1000
MAX_FACT_CHARS = 500
# memory_forget by query refuses to delete more than this many facts at once.
MAX_FORGET_AT_ONCE = 5

FactStatus = Literal["active", "archived"]


class Fact(VersionedRecord):
    """One remembered fact. ``source`` is the conversation key it was reviewed from, or
    ``"tool"`` when the model stored it with ``memory_store``."""

    SCHEMA_VERSION = SCHEMA_VERSION

    id: str
    text: str
    created_at: float
    updated_at: float
    source: str
    status: FactStatus = "active"



class MemoryRefused(UserInputError):
    """A memory change Fermix refuses (empty or too long, memory full, unknown fact); the
    message is written for the model to read."""


def clean(text: str) -> str:
    """A fact as stored: one line, single-spaced. Raises MemoryRefused if empty or too long."""
    one_line = " ".join(str(text).split())
    if not one_line:
        raise MemoryRefused("a fact needs some text")
    if len(one_line) > MAX_FACT_CHARS:
        raise MemoryRefused(
            f"a fact is at most {MAX_FACT_CHARS} characters (this one has {len(one_line)}); "
            "say it shorter"
        )
    return one_line


def normalized(text: str) -> str:
    """The de-duplication key: case-folded, single-spaced, without trailing punctuation."""
    return " ".join(text.split()).casefold().rstrip(" .!;,")
