"""Settings: environment over fermix.toml over defaults; secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fermix_shared.agents.definitions import agent_named, bound_agent
from fermix_shared.channels.modes import queue_mode_for
from fermix_shared.errors import ConfigError
from fermix_shared.provider_routes import resolved_model, resolved_provider
from fermix_shared.settings import LoopGuardConfig, Settings


def test_toml_named_by_fermix_config_is_read_and_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "fermix.toml"
    cfg.write_text('provider = "anthropic"\nmodel = "from-toml"\nlease_seconds = 12\n')
    monkeypatch.setenv("FERMIX_CONFIG", str(cfg))
    monkeypatch.setenv("FERMIX_MODEL", "from-env")
    s = Settings()
    assert resolved_provider(s) == "anthropic"
    assert resolved_model(s) == "from-env"
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
    assert resolved_provider(Settings()) == "anthropic"
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert resolved_provider(Settings()) == "openai"


def test_the_example_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "fermix.toml.example"
    monkeypatch.setenv("FERMIX_CONFIG", str(example))
    for var in ("FERMIX_PROVIDER", "FERMIX_MODEL", "FERMIX_LEASE_SECONDS"):
        monkeypatch.delenv(var, raising=False)
    s = Settings()
    assert [(r.provider, r.model) for r in s.routes] == [
        ("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-4.1-mini")]
    assert s.lease_seconds == 30 and s.turn_max_attempts == 3
    assert queue_mode_for(s, "http") == "followup"
    assert s.loop_guard == LoopGuardConfig()  # the example spells out the defaults
    from fermix_shared.models import ConversationKey
    from fermix_shared.settings import ApprovalsConfig

    assert bound_agent(s.bindings, ConversationKey(channel="slack", chat_id="C0123456")) == "coder"
    researcher = agent_named(s.agents, "researcher")
    assert researcher is not None and researcher.role == "sub"
    assert s.approvals == ApprovalsConfig()
    assert "gpt-4.1" in s.prices


# -- [loop_guard] ------------------------------------------------------------------------------


def test_loop_guard_defaults_are_the_seed_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERMIX_CONFIG", raising=False)
    g = Settings().loop_guard
    assert (g.window, g.warn_at, g.kill_at) == (10, 3, 5)
    assert (g.pingpong_warn, g.pingpong_kill, g.max_tool_calls, g.streak_warn) == (4, 8, 250, 5)


def test_loop_guard_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERMIX_CONFIG", raising=False)
    monkeypatch.setenv("FERMIX_LOOP_GUARD__WINDOW", "20")
    monkeypatch.setenv("FERMIX_LOOP_GUARD__KILL_AT", "7")
    monkeypatch.setenv("FERMIX_LOOP_GUARD__STREAK_WARN", "12")
    g = Settings().loop_guard
    assert (g.window, g.warn_at, g.kill_at, g.streak_warn) == (20, 3, 7, 12)


def test_loop_guard_table_in_toml_and_env_wins_per_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "fermix.toml"
    cfg.write_text(
        "[loop_guard]\nwindow = 12\nwarn_at = 4\nkill_at = 6\npingpong_warn = 5\n"
        "pingpong_kill = 9\nmax_tool_calls = 100\nstreak_warn = 10\n"
    )
    monkeypatch.setenv("FERMIX_CONFIG", str(cfg))
    g = Settings().loop_guard
    assert g.model_dump() == {
        "window": 12, "warn_at": 4, "kill_at": 6, "pingpong_warn": 5, "pingpong_kill": 9,
        "max_tool_calls": 100, "streak_warn": 10,
    }
    monkeypatch.setenv("FERMIX_LOOP_GUARD__KILL_AT", "8")
    g = Settings().loop_guard
    assert (g.window, g.warn_at, g.kill_at) == (12, 4, 8)


@pytest.mark.parametrize(("env", "message"), [
    ({"KILL_AT": "3"}, "loop_guard\n  Value error, kill_at (3) must be greater than warn_at (3)"),
    ({"WINDOW": "4"}, "loop_guard\n  Value error, kill_at (5) must not exceed window (4): repeats could never reach it"),
    ({"PINGPONG_WARN": "8"}, "loop_guard\n  Value error, pingpong_kill (8) must be greater than pingpong_warn (8)"),
    ({"WINDOW": "0"}, "loop_guard.window\n  Input should be greater than or equal to 1"),
    ({"STREAK_WARN": "1"}, "loop_guard.streak_warn\n  Input should be greater than or equal to 2"),
    ({"MAX_TOOL_CALLS": "lots"}, "loop_guard.max_tool_calls\n  Input should be a valid integer"),
    ({"WINDOWS": "10"}, "loop_guard.windows\n  Extra inputs are not permitted"),
])
def test_invalid_loop_guard_values_are_refused_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.delenv("FERMIX_CONFIG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(f"FERMIX_LOOP_GUARD__{key}", value)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert message in str(info.value)


# --- mistakes in the file are one sentence (issue 32 item 9) ------------------------------------

@pytest.mark.parametrize(("toml", "message"), [
    ('modle = "gpt-4.1"\n', "unknown key 'modle' (did you mean 'model'?)"),
    ("[limits]\nmax_text_char = 5\n",
     "unknown key 'limits.max_text_char' (did you mean 'limits.max_text_chars'?)"),
    ("[limts]\nmax_text_chars = 5\n", "unknown key 'limts' (did you mean 'limits'?)"),
    ("[loop_guard]\nwindows = 10\n",
     "unknown key 'loop_guard.windows' (did you mean 'loop_guard.window'?)"),
    ("zzz_qqq = 1\n", "unknown key 'zzz_qqq'; docs/configuration.md lists every key"),
])
def test_an_unknown_key_in_the_file_is_refused_naming_the_nearest_known_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, message: str
) -> None:
    cfg = tmp_path / "fermix.toml"
    cfg.write_text(toml)
    monkeypatch.setenv("FERMIX_CONFIG", str(cfg))
    with pytest.raises(ConfigError) as info:
        Settings()
    said = str(info.value)
    assert said.startswith(f"{cfg}: {message}") and said.endswith("lists every key"), said


def test_the_operators_own_keys_in_tables_of_models_are_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[prices."model-id"]`` and ``[mcp.servers.name]`` name the operator's things."""
    cfg = tmp_path / "fermix.toml"
    cfg.write_text('[prices."my-local-model"]\ninput = 0.1\noutput = 0.2\n')
    monkeypatch.setenv("FERMIX_CONFIG", str(cfg))
    assert "my-local-model" in Settings().prices
