"""Long-term memory: remembered facts in Redis, and the memory sections of the system prompt."""

from fermix_shared.memory.fact import (
    MAX_ACTIVE_FACTS,
    MAX_FACT_CHARS,
    MAX_FORGET_AT_ONCE,
    Fact,
    MemoryRefused,
)
from fermix_shared.memory.prompt_files import load_prompt_memory, memory_section
from fermix_shared.memory.store import MemoryStore

__all__ = [
    "MAX_ACTIVE_FACTS",
    "MAX_FACT_CHARS",
    "MAX_FORGET_AT_ONCE",
    "Fact",
    "MemoryRefused",
    "MemoryStore",
    "load_prompt_memory",
    "memory_section",
]
