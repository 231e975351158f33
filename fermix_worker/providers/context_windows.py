"""Context windows by model id: a small catalog, overridable in TOML (``context_windows``) and,
for models it does not know, by ``FERMIX_CONTEXT_WINDOW``."""

from __future__ import annotations

from fermix_shared.settings import Settings

# Longest prefix wins. Numbers are the providers' published input windows (tokens).
CATALOG: dict[str, int] = {
    "claude-opus-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5": 200_000,
    "claude": 200_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-5": 400_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "o1": 200_000,
}
FALLBACK_WINDOW = 128_000


def context_window(model: str, settings: Settings) -> int:
    """The model's context window in tokens."""
    if model in settings.context_windows:
        return settings.context_windows[model]
    best = max((p for p in CATALOG if model.startswith(p)), key=len, default=None)
    if best is not None:
        return CATALOG[best]
    return settings.context_window or FALLBACK_WINDOW
