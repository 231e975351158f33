"""The scripted model's prompt cache: prompt sizes and cache reads reported as the real APIs do.

A prompt's size is its canonical JSON at 4 characters a token (tools, then the system prompt,
then the messages; ``cache_control`` marks left out, so a marked and an unmarked prompt measure
and match alike), plus one. Deterministic: no expiry (the real caches keep an entry 5 minutes
or more after its last use), no eviction below 65536 entries a provider, cleared with the script.

Anthropic (explicit breakpoints): the prompt is a sequence of blocks (each tool definition,
each system block, each content block of each message, a string content being one text block).
A block carrying ``cache_control`` is a breakpoint; more than 4 is refused with the API's 400.
A request reads the longest prefix, ending at one of its breakpoints or at one of the 19 block
boundaries before each, that an earlier request wrote; it writes the prefix up to each of its
breakpoints, and reports as ``cache_creation_input_tokens`` the tokens from what it read to its
last breakpoint. A prefix under 1024 tokens is never cached (the Sonnet/Opus minimum; no error).
``input_tokens`` is the rest.

OpenAI (automatic): a prompt of 1024 tokens or more is cached; a later prompt whose first tokens
match an earlier one's reads them in ``prompt_tokens_details.cached_tokens``: the longest
matching prefix counted in whole 128-token units, at least 1024 (OpenAI's documented rule: the
first 1024 tokens, then 128-token increments). ``prompt_tokens`` includes them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20  # a breakpoint and the 19 block boundaries before it
MIN_CACHED_TOKENS = 1024
OPENAI_INCREMENT = 128
CHARS_PER_TOKEN = 4
_MAX_ENTRIES = 65536


class TooManyBreakpoints(ValueError):
    """An Anthropic request with more than four ``cache_control`` blocks (the API's 400)."""

    def __init__(self, found: int) -> None:
        super().__init__(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                         f"provided. Found {found}.")


@dataclass(frozen=True)
class PromptTokens:
    """One request's prompt: every token of it, and the parts read from and written to the
    cache."""

    total: int
    cache_read: int = 0
    cache_write: int = 0


def canonical(item: dict[str, Any]) -> str:
    """``item`` as compact sorted JSON, without its ``cache_control`` mark."""
    return json.dumps({k: v for k, v in item.items() if k != "cache_control"}, sort_keys=True,
                      separators=(",", ":"), default=str)


def _blocks_of(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def anthropic_blocks(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """The request's blocks in cache order (tools, system, messages): ``(canonical text,
    carries a breakpoint)`` each."""
    out = [(canonical({**t, "in": "tools"}), "cache_control" in t)
           for t in body.get("tools") or [] if isinstance(t, dict)]
    out += [(canonical({**b, "in": "system"}), "cache_control" in b)
            for b in _blocks_of(body.get("system"))]
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            out += [(canonical({**b, "role": m.get("role")}), "cache_control" in b)
                    for b in _blocks_of(m.get("content"))]
    return out


def openai_text(body: dict[str, Any]) -> str:
    """The request's prompt as one string, tools first, in the order the model reads it."""
    parts = [canonical(t) for t in body.get("tools") or [] if isinstance(t, dict)]
    parts += [canonical(m) for m in body.get("messages") or [] if isinstance(m, dict)]
    return "".join(parts)


class PromptCache:
    """The prefixes earlier requests left in the cache, per provider (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._anthropic: OrderedDict[str, None] = OrderedDict()
        self._openai: OrderedDict[str, None] = OrderedDict()

    def clear(self) -> None:
        with self._lock:
            self._anthropic.clear()
            self._openai.clear()

    def account(self, provider: str, body: dict[str, Any]) -> PromptTokens:
        """Measure ``body``'s prompt against the cache and leave what it writes there (module
        docstring). Raises TooManyBreakpoints for an Anthropic request with more than 4."""
        with self._lock:
            if provider == "anthropic":
                return self._anthropic_call(body)
            return self._openai_call(body)

    def _anthropic_call(self, body: dict[str, Any]) -> PromptTokens:
        blocks = anthropic_blocks(body)
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        if len(marks) > MAX_BREAKPOINTS:
            raise TooManyBreakpoints(len(marks))
        chars, hashes, h = [], [], _seed(body)
        size = 0
        for text, _ in blocks:
            size += len(text)
            h = _chain(h, text)
            chars.append(size)
            hashes.append(h)
        total = size // CHARS_PER_TOKEN + 1
        if not marks:
            return PromptTokens(total)
        read_at = max((j for b in marks for j in range(b, max(-1, b - LOOKBACK_BLOCKS), -1)
                       if hashes[j] in self._anthropic), default=-1)
        read = chars[read_at] // CHARS_PER_TOKEN if read_at >= 0 else 0
        last = chars[marks[-1]] // CHARS_PER_TOKEN
        write = last - read if last >= MIN_CACHED_TOKENS and marks[-1] > read_at else 0
        for b in marks:
            if chars[b] // CHARS_PER_TOKEN >= MIN_CACHED_TOKENS:
                _keep(self._anthropic, hashes[b])
        if read_at >= 0:
            _keep(self._anthropic, hashes[read_at])  # a read refreshes the entry
        return PromptTokens(total, read, write)

    def _openai_call(self, body: dict[str, Any]) -> PromptTokens:
        text = openai_text(body)
        unit = OPENAI_INCREMENT * CHARS_PER_TOKEN
        h, cached, units = _seed(body), 0, len(text) // unit
        prefixes = []
        for k in range(1, units + 1):
            h = _chain(h, text[(k - 1) * unit : k * unit])
            prefixes.append(h)
            if h in self._openai:
                cached = k * OPENAI_INCREMENT
        if cached < MIN_CACHED_TOKENS:
            cached = 0
        if units * OPENAI_INCREMENT >= MIN_CACHED_TOKENS:
            for p in prefixes:
                _keep(self._openai, p)
        return PromptTokens(len(text) // CHARS_PER_TOKEN + 1, cached)


def _seed(body: dict[str, Any]) -> str:
    """Caches are per model."""
    return hashlib.sha256(str(body.get("model")).encode()).hexdigest()


def _chain(h: str, text: str) -> str:
    return hashlib.sha256((h + text).encode()).hexdigest()


def _keep(entries: OrderedDict[str, None], key: str) -> None:
    entries[key] = None
    entries.move_to_end(key)
    while len(entries) > _MAX_ENTRIES:
        entries.popitem(last=False)
