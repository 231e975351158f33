"""The request body cap (fermix_gateway/body_limit.py): refused with 413 and a reason before the
body is read whole, on every inbound route, whether the size is declared or streamed.

Issue 13: 50 MB bodies were read whole before a 422. Here the app is driven at the ASGI level
with a ``receive`` that counts the bytes the app pulls, so "before it is read" is measured, not
assumed. (tests/gateway/test_fuzz.py does the same through a real uvicorn.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from fermix_shared.settings import Settings
from tests.gateway.inprocess import TG_SECRET, settings_for

MiB = 1024 * 1024
CHUNK = 64 * 1024
ROUTES = {
    "/v1/agent": {"content-type": "application/json"},
    "/webhooks/telegram": {"content-type": "application/json",
                           "x-telegram-bot-api-secret-token": TG_SECRET},
    "/webhooks/slack/events": {"content-type": "application/json",
                               "x-slack-signature": "v0=00", "x-slack-request-timestamp": "1"},
    "/webhooks/slack/commands": {"content-type": "application/x-www-form-urlencoded",
                                 "x-slack-signature": "v0=00", "x-slack-request-timestamp": "1"},
}


def fifty_megabytes() -> Iterator[bytes]:
    """A 50 MB body, made only as far as it is read."""
    yield b'{"message": "'
    for _ in range(50 * MiB // CHUNK):
        yield b"a" * CHUNK


class Exchange:
    """One request through the ASGI app; ``pulled`` counts the body bytes the app took."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        chunk = next(self.chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        self.pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    def json(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


def post(path: str, headers: dict[str, str], chunks: Iterator[bytes],
         settings: Settings | None = None) -> Exchange:
    app = create_app(settings or settings_for("redis://127.0.0.1:1/0"), hooks=HookRegistry())
    exchange = Exchange(chunks)
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, exchange.receive, exchange.send))
    return exchange


@pytest.mark.parametrize("path", ROUTES)
def test_a_declared_oversized_body_is_refused_before_a_byte_is_read(path: str) -> None:
    headers = {**ROUTES[path], "content-length": str(50 * MiB)}
    exchange = post(path, headers, fifty_megabytes())
    assert exchange.status == 413
    assert exchange.json() == {
        "error": f"request body is larger than {MiB} bytes (FERMIX_LIMITS__MAX_BODY_BYTES)"}
    assert exchange.pulled == 0


@pytest.mark.parametrize("path", ROUTES)
def test_a_streamed_body_is_cut_off_at_the_cap(path: str) -> None:
    exchange = post(path, ROUTES[path], fifty_megabytes())  # chunked: no content-length
    assert exchange.status == 413
    assert exchange.json()["error"].startswith(f"request body is larger than {MiB} bytes")
    assert exchange.pulled <= MiB + CHUNK


def test_the_cap_is_a_setting_and_a_body_under_it_is_read() -> None:
    settings = settings_for("redis://127.0.0.1:1/0", max_body_bytes=4096, max_text_chars=100)
    small = iter([b'{"message": "' + b"a" * 4000 + b'"}'])
    exchange = post("/v1/agent", ROUTES["/v1/agent"], small, settings)
    assert exchange.pulled == 4015
    assert exchange.status == 422  # read and parsed: refused by the text limit, not the cap
    assert exchange.json()["error"].startswith("message: at most 100 characters, got 4000")
    too_big = iter([b'{"message": "' + b"a" * 4100 + b'"}'])
    exchange = post("/v1/agent", ROUTES["/v1/agent"], too_big, settings)
    assert exchange.status == 413
    assert "larger than 4096 bytes" in exchange.json()["error"]


def test_a_forged_telegram_update_stays_a_401_whatever_its_size() -> None:
    headers = {**ROUTES["/webhooks/telegram"], "x-telegram-bot-api-secret-token": "forged",
               "content-length": str(50 * MiB)}
    exchange = post("/webhooks/telegram", headers, fifty_megabytes())
    assert exchange.status == 401
    assert exchange.pulled == 0


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERMIX_LIMITS__MAX_BODY_BYTES", "65536")
    monkeypatch.setenv("FERMIX_LIMITS__SENDER_MESSAGES_PER_MINUTE", "0")
    limits = Settings().limits
    assert (limits.max_body_bytes, limits.sender_messages_per_minute) == (65536, 0)
    assert (limits.max_text_chars, limits.max_queued_per_conversation) == (32_000, 100)
