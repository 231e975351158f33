"""What is wrong with a configuration, in one sentence: keys of the TOML file that no setting
reads (named with the nearest known key), and a settings ValidationError (each field and its
reason, never the value). Used by :mod:`fermix_shared.settings` as it reads the file, by the
CLI (exit 2) and by ``fermix doctor``; it imports no settings, only pydantic."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from fermix_shared.errors import ConfigError

__all__ = ["invalid", "unknown_keys"]


def unknown_keys(data: dict[str, Any], model: type[BaseModel], path: str) -> None:
    """Raise ConfigError for the first key of the TOML file that no setting reads, at the top
    level or in a section (a table whose setting is a model), naming the nearest known key:
    ``fermix.toml: unknown key 'modle' (did you mean 'model'?)``. The top level would
    otherwise ignore it silently (the environment shares the level with FERMIX_ variables
    that are not settings)."""
    def walk(table: dict[str, Any], cls: type[BaseModel], where: str) -> None:
        known = set(cls.model_fields)
        for key, value in table.items():
            name = f"{where}{key}"
            if key not in known:
                near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
                hint = f" (did you mean '{where}{near[0]}'?)" if near else ""
                raise ConfigError(f"{path}: unknown key '{name}'{hint}; "
                                  "docs/configuration.md lists every key")
            inner = _model_of(cls.model_fields[key].annotation)
            if inner is not None and isinstance(value, dict):
                walk(value, inner, f"{name}.")

    walk(data, model, "")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``X`` or ``X | None``), or None for anything else."""
    origin = typing.get_origin(annotation)
    if origin is None:
        candidates = [annotation]
    elif origin in (typing.Union, types.UnionType):
        candidates = list(typing.get_args(annotation))
    else:  # a dict or a list of models: its keys are the operator's own (prices, servers)
        return None
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def invalid(e: ValidationError, limit: int = 5) -> str:
    """A settings ValidationError as one sentence: ``key.path: message`` per error, without
    the values given (one may be a secret)."""
    errors = e.errors(include_input=False, include_url=False)
    parts = [f"{'.'.join(str(x) for x in err['loc']) or 'settings'}: {err['msg']}"
             for err in errors[:limit]]
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more")
    return "; ".join(parts)
