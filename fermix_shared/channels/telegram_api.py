"""A thin synchronous client for the Telegram Bot API: ``POST {base}/bot{token}/{method}``.

The bot token is part of every URL, so nothing here logs a URL or an exception's text that
could hold one: logs and errors name the method only. httpx's own request log line (INFO on the
``httpx`` logger) is passed through a filter that redacts bot tokens.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import httpx

from fermix_shared.channels.base import ChannelError
from fermix_shared.errors import ConfigError
from fermix_shared.logs import RedactSecrets
from fermix_shared.settings import Settings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 30.0

_client: httpx.Client | None = None
_client_pid: int | None = None
_client_lock = threading.Lock()


class TelegramError(ChannelError):
    """A Bot API call failed: Telegram answered ``ok: false``, or the request did not complete.

    ``status`` is Telegram's ``error_code`` (else the HTTP status; None when no answer came),
    ``retry_after`` the seconds a 429 asks us to wait, ``migrate_to_chat_id`` the new id of a
    group that became a supergroup.
    """

    def __init__(
        self,
        method: str,
        status: int | None,
        description: str,
        retry_after: float | None = None,
        migrate_to_chat_id: int | None = None,
    ) -> None:
        super().__init__(f"Telegram {method} failed ({status or 'no answer'}): {description}")
        self.method = method
        self.status = status
        self.description = description
        self.retry_after = retry_after
        self.migrate_to_chat_id = migrate_to_chat_id

    @property
    def transient(self) -> bool:
        """Worth retrying the same request: no answer, or a server-side error."""
        return self.status is None or self.status >= 500

    @property
    def cannot_parse_entities(self) -> bool:
        """Telegram refused our formatting (the message would go out as plain text)."""
        return self.status == 400 and "can't parse entities" in self.description.lower()


def _shared_client() -> httpx.Client:
    """One connection pool per process (a client inherited across fork is not reused)."""
    global _client, _client_pid
    with _client_lock:
        if _client is None or _client_pid != os.getpid():
            httpx_log = logging.getLogger("httpx")
            # httpx logs each request's URL, and a Bot API URL holds the token.
            if not any(isinstance(f, RedactSecrets) for f in httpx_log.filters):
                httpx_log.addFilter(RedactSecrets())
            _client = httpx.Client(
                timeout=httpx.Timeout(READ_TIMEOUT_SECONDS, connect=CONNECT_TIMEOUT_SECONDS)
            )
            _client_pid = os.getpid()
        return _client


class TelegramApi:
    """Calls Bot API methods with JSON bodies and returns their ``result``.

    Raises :class:`TelegramError` when Telegram answers ``ok: false`` or the request fails.
    Safe to share between threads and greenlets.
    """

    def __init__(self, token: str, api_base: str = "https://api.telegram.org") -> None:
        if not token:
            raise ConfigError("FERMIX_TELEGRAM_BOT_TOKEN is not set")
        self._token = token
        self._base = api_base.rstrip("/")

    @classmethod
    def from_settings(cls, settings: Settings) -> TelegramApi:
        token = settings.telegram_bot_token
        if token is None:
            raise ConfigError("FERMIX_TELEGRAM_BOT_TOKEN is not set")
        return cls(token.get_secret_value(), settings.telegram_api_base)

    @property
    def bot_id(self) -> int | None:
        """The bot's user id: a token is ``<bot id>:<secret>``."""
        head = self._token.split(":", 1)[0]
        return int(head) if head.isdigit() else None

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """``POST {base}/bot{token}/{method}`` with ``params`` as JSON; the answer's ``result``."""
        return self._post(method, json=params or {})

    def upload(self, method: str, params: dict[str, Any], field: str, filename: str,
               data: bytes) -> Any:
        """``method`` with ``params`` and one file (``field``: ``document``) as
        multipart/form-data, the way the Bot API takes uploads; the answer's ``result``."""
        form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
        return self._post(method, data=form, files={field: (filename, data)})

    def _post(self, method: str, **request: Any) -> Any:
        url = f"{self._base}/bot{self._token}/{method}"
        try:
            resp = _shared_client().post(url, **request)
        except httpx.HTTPError as e:
            # The exception's text may carry the URL, hence the token.
            reason = f"{type(e).__name__}: {e}".replace(self._token, "<redacted>")
            raise TelegramError(method, None, reason) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise TelegramError(method, resp.status_code, f"HTTP {resp.status_code}, not JSON")
        if body.get("ok") is True:
            return body.get("result")
        parameters = body.get("parameters") or {}
        retry_after = parameters.get("retry_after")
        migrate = parameters.get("migrate_to_chat_id")
        raise TelegramError(
            method,
            int(body.get("error_code") or resp.status_code),
            str(body.get("description") or "no description"),
            float(retry_after) if isinstance(retry_after, int | float) else None,
            int(migrate) if isinstance(migrate, int) else None,
        )
