"""Settings: environment over fermix.toml over defaults; secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from fermix_shared.errors import ConfigError
from fermix_shared.settings import Settings


def test_toml_named_by_fermix_config_is_read_and_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "fermix.toml"
    cfg.write_text('provider = "anthropic"\nmodel = "from-toml"\nlease_seconds = 12\n')
    monkeypatch.setenv("FERMIX_CONFIG", str(cfg))
    monkeypatch.setenv("FERMIX_MODEL", "from-env")
    s = Settings()
    assert s.resolved_provider() == "anthropic"
    assert s.resolved_model() == "from-env"
    assert s.lease_seconds == 12


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERMIX_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="nope.toml, which is not a file"):
        Settings()


def test_the_api_token_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERMIX_API_TOKEN", "hunter2")
    s = Settings()
    assert s.api_token is not None and s.api_token.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())


def test_provider_defaults_follow_the_sdk_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERMIX_PROVIDER", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert Settings().resolved_provider() == "anthropic"
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert Settings().resolved_provider() == "openai"


def test_the_example_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "fermix.toml.example"
    monkeypatch.setenv("FERMIX_CONFIG", str(example))
    for var in ("FERMIX_PROVIDER", "FERMIX_MODEL", "FERMIX_LEASE_SECONDS"):
        monkeypatch.delenv(var, raising=False)
    s = Settings()
    assert [(r.provider, r.model) for r in s.routes] == [
        ("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-4.1-mini")]
    assert s.lease_seconds == 30 and s.turn_max_attempts == 3
    assert s.queue_mode_for("http") == "followup"
