"""Log lines: JSON or text, carrying the turn's context, and never a secret."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import gevent
import pytest
from gevent.event import Event

from fermix_shared.logs import (
    MASK,
    RedactSecrets,
    current_context,
    install,
    log_context,
    secret_values,
)
from fermix_shared.settings import Settings

TOKEN = "api-token-5f3a9c"
BOT = "123456:AAbotTokenXYZ"
KEY = "sk-openai-91bd"


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("fermix.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)


def settings(log_format: str = "json") -> Settings:
    return Settings(api_token=TOKEN, telegram_bot_token=BOT, log_format=log_format,
                    redis_url="redis://:redis-pw-77@127.0.0.1:6379/0")


def test_json_lines_carry_the_turn_context(capture: tuple[logging.Logger, io.StringIO,
                                                           logging.Handler]) -> None:
    logger, stream, handler = capture
    install([handler], settings(), environ={})
    logger.info("outside")
    # Nested blocks add to the outer fields.
    with log_context(run_id="run_abc", conversation="telegram:42", agent="default"), \
            log_context(worker="w1@host"):
        logger.warning("step %d of %s", 3, "turn")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [set(x) for x in lines][0] == {"ts", "level", "logger", "msg"}
    assert lines[1] == {**lines[1], "level": "WARNING", "logger": "fermix.test_logs",
                        "msg": "step 3 of turn", "run_id": "run_abc",
                        "conversation": "telegram:42", "agent": "default", "worker": "w1@host"}
    assert lines[1]["ts"].endswith("+00:00") and "T" in lines[1]["ts"]
    assert current_context() == {}


def test_exceptions_and_every_secret_are_masked_in_both_formats(
        capture: tuple[logging.Logger, io.StringIO, logging.Handler]) -> None:
    logger, stream, handler = capture
    for fmt in ("json", "text"):
        install([handler], settings(fmt), environ={"OPENAI_API_KEY": KEY})
        logger.info("token %s bot %s", TOKEN, BOT)
        logger.info("GET https://api.telegram.org/bot%s/getMe and key=%s", "999:other", KEY)
        logger.info("redis at redis://:redis-pw-77@10.0.0.5:6379/0")
        try:
            raise RuntimeError(f"provider refused key {KEY}")
        except RuntimeError:
            logger.exception("turn failed")
    out = stream.getvalue()
    for secret in (TOKEN, BOT, KEY, "999:other", "redis-pw-77"):
        assert secret not in out
    assert out.count(MASK) >= 12
    first = json.loads(out.splitlines()[0])
    assert first["msg"] == f"token {MASK} bot {MASK}"
    failed = [json.loads(x) for x in out.splitlines() if x.startswith("{") and "turn failed" in x]
    assert "RuntimeError: provider refused key " + MASK in failed[0]["exc"]
    assert "] fermix.test_logs: redis at redis://:" + MASK + "@10.0.0.5" in out


def test_text_lines_show_the_run_id(capture: tuple[logging.Logger, io.StringIO,
                                                    logging.Handler]) -> None:
    logger, stream, handler = capture
    install([handler], settings("text"), environ={})
    with log_context(run_id="run_xyz"):
        logger.info("model answered")
    logger.info("idle")
    first, second = stream.getvalue().splitlines()
    assert first.endswith("fermix.test_logs: [run_xyz] model answered") and " INFO/" in first
    assert second.endswith("fermix.test_logs: idle")


def test_secret_values_come_from_settings_environment_and_urls() -> None:
    env = {"ANTHROPIC_API_KEY": "ant-key-1", "SLACK_SIGNING_SECRET": "sig-secret",
           "FLOWER_BASIC_AUTH": "admin:flowerpw", "HOME": "/root", "PATH": "/usr/bin",
           "BROKER": "amqp://u:amqp-pw@h/", "FERMIX_MAX_TOKENS": "4096"}
    found = secret_values(settings(), env)
    assert {TOKEN, BOT, "redis-pw-77", "ant-key-1", "sig-secret", "admin:flowerpw",
            "amqp-pw"} <= found
    assert not {"/root", "/usr/bin", "4096"} & found
    # Too short to mask without mangling ordinary words.
    assert RedactSecrets(["ab"]).redact("tab cab") == "tab cab"


def test_each_greenlet_keeps_its_own_context() -> None:
    seen: dict[str, dict[str, str]] = {}
    both_inside = [Event(), Event()]

    def turn(i: int) -> None:
        with log_context(run_id=f"run_{i}", conversation=f"api:{i}"):
            both_inside[i].set()
            both_inside[1 - i].wait(2)  # the other greenlet is inside its block now
            seen[f"g{i}"] = current_context()

    gevent.joinall([gevent.spawn(turn, 0), gevent.spawn(turn, 1)], timeout=5)
    assert seen == {"g0": {"run_id": "run_0", "conversation": "api:0"},
                    "g1": {"run_id": "run_1", "conversation": "api:1"}}
    assert current_context() == {}
