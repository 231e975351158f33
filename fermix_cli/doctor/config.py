"""``fermix doctor``: does the configuration parse? Settings from the environment and the
TOML file named by ``FERMIX_CONFIG``; a broken file is a ``fail`` line naming the file and
the error (never a traceback), and the other checks go on with the environment alone."""

from __future__ import annotations

import os
import tomllib

from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from fermix_cli.doctor.check import Check, clip
from fermix_shared.errors import ConfigError
from fermix_shared.settings import Settings
from fermix_shared.settings_check import invalid


class _EnvironmentOnly(Settings):
    """Settings without FERMIX_CONFIG: what the checks use when the file is broken."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)


def _problem(e: Exception, path: str | None) -> tuple[str, str]:
    """(what is wrong, how to fix it) for an exception raised while reading settings."""
    source = f"the environment and {path}" if path else "the environment"
    if isinstance(e, tomllib.TOMLDecodeError):
        return (f"{path} is not valid TOML: {e}",
                f"correct {path} at that line and column, or unset FERMIX_CONFIG")
    if isinstance(e, ValidationError):
        return (f"settings from {source} do not validate: {invalid(e)}",
                "correct those keys in the file, or their FERMIX_* variables (FERMIX_ and the "
                "key in capitals, __ between levels: FERMIX_LIMITS__MAX_TEXT_CHARS)")
    if isinstance(e, OSError):
        return (f"cannot read {path}: {e.strerror or e}",
                f"make {path} readable by this user, or unset FERMIX_CONFIG")
    if isinstance(e, ConfigError):
        return str(e), "point FERMIX_CONFIG at a readable fermix.toml, or unset it"
    return (f"settings from {source} do not load: {clip(str(e))}",
            "correct the file or the FERMIX_* variables it names")


def load_settings() -> tuple[Settings | None, Check]:
    """The settings the other checks use, and the ``config`` line.

    When the TOML file is broken but the environment is fine, the environment's settings come
    back with a ``fail`` line; when nothing loads, None.
    """
    path = os.environ.get("FERMIX_CONFIG") or None
    try:
        settings = Settings()
    except Exception as e:  # every way settings fail is reported, none is a traceback
        message, fix = _problem(e, path)
    else:
        where = f"the environment and {path}" if path else "the environment (no FERMIX_CONFIG)"
        return settings, Check("config", "ok", f"Settings load from {where}.")
    try:
        fallback: Settings | None = _EnvironmentOnly() if path else None
    except Exception:
        fallback = None
    if fallback is None:
        return None, Check("config", "fail", f"{message}; nothing else can be checked.", fix)
    return fallback, Check("config", "fail",
                           f"{message}; the checks below use the environment alone.", fix)
