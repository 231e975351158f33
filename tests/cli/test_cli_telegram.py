"""``fermix telegram set-webhook URL``: the CLI (in this process) against the fake Bot API."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fermix_cli.main import main
from fermix_shared.settings import get_settings
from tests.fakes.telegram_api import FakeTelegram

TOKEN = "123456:TEST-token_abc"


@pytest.fixture
def telegram(monkeypatch: pytest.MonkeyPatch, scratch_redis_url: str) -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as fake:
        monkeypatch.setenv("FERMIX_TELEGRAM_BOT_TOKEN", TOKEN)
        monkeypatch.setenv("FERMIX_TELEGRAM_API_BASE", fake.url)
        monkeypatch.setenv("FERMIX_TELEGRAM_WEBHOOK_SECRET", "s3cret-Token_1")
        monkeypatch.setenv("FERMIX_REDIS_URL", scratch_redis_url)
        get_settings.cache_clear()
        yield fake
        get_settings.cache_clear()


def run(*args: str) -> int:
    try:
        main(["telegram", "set-webhook", *args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_set_webhook_says_what_it_set_and_prints_it_as_json_on_request(
    telegram: FakeTelegram, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "https://bot.example.com/webhooks/telegram"
    assert run(url) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"Webhook set to {url} for @")
    assert said[1].startswith("Set FERMIX_TELEGRAM_BOT_USERNAME=")
    [call] = telegram.calls("setWebhook")
    assert call.body["url"] == url and call.body["secret_token"] == "s3cret-Token_1"
    assert run(url, "--json") == 0
    body = json.loads(capsys.readouterr().out)
    assert body["ok"] is True and body["webhook"] == url and body["bot"]
    assert run("http://plain.example.com/hook") == 2
    assert "only delivers webhooks to https URLs" in capsys.readouterr().err
