"""The real gateway app in-process (starlette's TestClient) on a private Redis database, with
a Celery stand-in that records the tasks the gateway sends, and the webhook signers.

Everything between the HTTP request and Redis is the production code: middleware, routes,
parsers, ``receive``, the accept script. Only the broker is left out (nothing consumes here).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from fastapi.testclient import TestClient

from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from fermix_shared.task_names import DISPATCH_TASK, SEND_TASK
from tests.fakes.slack_api import sign

TG_SECRET = "tg-Secret_1"
TG_BOT = "fermix_test_bot"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SLACK_BOT = "U0BOT"
TG_OWNER, SLACK_OWNER = 111, "U0OWNER"

__all__ = ["DISPATCH_TASK", "SEND_TASK", "RecordingCelery", "gateway", "settings_for"]


class RecordingCelery:
    """What the gateway asks of its task publisher (``app.state.tasks``): ``send(name, args)``,
    recorded at once (the real :class:`~fermix_gateway.publisher.TaskPublisher` publishes
    from its own thread)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str]]] = []

    def send(self, name: str, args: list[str]) -> None:
        self.sent.append((name, list(args)))

    def named(self, name: str) -> list[list[str]]:
        return [args for task, args in self.sent if task == name]


def settings_for(redis_url: str, **limits: int) -> Settings:
    return Settings(
        redis_url=redis_url, telegram_webhook_secret=TG_SECRET, telegram_bot_username=TG_BOT,
        slack_signing_secret=SLACK_SECRET, slack_bot_user_id=SLACK_BOT,
        owner_ids=[f"telegram:{TG_OWNER}", f"slack:{SLACK_OWNER}"],
        limits=limits,
    )


@contextmanager
def gateway(redis_url: str, **limits: int) -> Iterator[tuple[TestClient, RecordingCelery]]:
    """The app (lifespan run), with ``limits`` over the defaults. Redis is not flushed."""
    app = create_app(settings_for(redis_url, **limits), hooks=HookRegistry())
    celery = RecordingCelery()
    app.state.tasks = celery
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, celery


def telegram_headers() -> dict[str, str]:
    return {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET, "Content-Type": "application/json"}


def slack_headers(body: bytes, content_type: str = "application/json") -> dict[str, str]:
    return {"Content-Type": content_type, **sign(body, SLACK_SECRET)}


def tg_update(update_id: int, text: str, chat: int = TG_OWNER, user: int = TG_OWNER,
              ) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1441645532, "text": text,
        "from": {"id": user, "is_bot": False, "first_name": "Owner"},
        "chat": {"id": chat, "type": "private"},
    }}


def flushed(url: str) -> str:
    redis.Redis.from_url(url).flushdb()
    return url
