"""The Slack Web API calls the Slack channel makes, over the official ``slack_sdk`` WebClient.

One WebClient per (API base, token) per process, with no SDK-level retries: :class:`SlackApi`
owns retrying (429s after Slack's ``Retry-After``, 5xx and connection errors with backoff), so
a message is never posted twice behind our back. Every call to a Slack channel is paced by the
shared per-channel rate limiter (:func:`pace_key`). Failures become
:class:`~fermix_shared.channels.base.ChannelError` (:class:`RateLimited` for a live change
Slack refused with a 429); tokens are never logged (:func:`safe`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError

from fermix_shared.channels.base import ChannelError, RateLimited
from fermix_shared.channels.ratelimit import RateLimiter
from fermix_shared.settings import Settings

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
# chat.update answers meaning the message cannot take the final reply: it is posted anew.
_GONE_ERRORS = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})

# One WebClient per (API base, token) per process.
_clients: dict[tuple[str, str], WebClient] = {}
_lock = threading.Lock()


def pace_key(channel: str) -> str:
    """The rate limiter's key for a Slack channel (posts and changes share its pace)."""
    return f"slack:channel:{channel}"


class SlackApi:
    """The calls of one :class:`~fermix_shared.channels.slack.SlackChannel`, paced at one per
    ``interval`` seconds per channel."""

    def __init__(self, settings: Settings, limiter: RateLimiter, *,
                 sleep: Callable[[float], None], interval: float) -> None:
        self._settings = settings
        self._limiter = limiter
        self._sleep = sleep
        self._interval = interval

    # -- the client --------------------------------------------------------------------------

    def workspace(self) -> tuple[str, str]:
        """(API base, token): what a WebClient, and what we learnt about a workspace, is for."""
        token = self._settings.slack_bot_token
        return (self._settings.slack_api_base, token.get_secret_value() if token else "")

    def client(self) -> WebClient:
        """This process's WebClient for our token and API base, made on first use."""
        base, token = self.workspace()
        if not token:
            raise ChannelError("FERMIX_SLACK_BOT_TOKEN is not set")
        with _lock:
            client = _clients.get((base, token))
            if client is None:
                # No SDK-level retries: post owns retrying, so a message is never posted twice
                # behind our back.
                client = WebClient(token=token, base_url=base.rstrip("/") + "/",
                                   timeout=30, retry_handlers=[])
                _clients[(base, token)] = client
            return client

    def client_or_none(self) -> WebClient | None:
        try:
            return self.client()
        except ChannelError as e:
            log.warning("slack: %s", e)
            return None

    # -- one call each -----------------------------------------------------------------------

    def auth_user_id(self) -> str:
        """``auth.test``: our bot's user id."""
        try:
            return str(self.client().auth_test()["user_id"])
        except SlackApiError as e:
            raise ChannelError(f"slack auth.test failed: {describe(e)[1]}") from e

    def post_ephemeral(self, args: dict[str, Any]) -> None:
        """``chat.postEphemeral``, paced; not retried."""
        self._limiter.acquire([(pace_key(args["channel"]), self._interval)])
        try:
            self.client().chat_postEphemeral(**args)
        except SlackApiError as e:
            raise ChannelError(f"slack chat.postEphemeral failed: {describe(e)[1]}") from e
        except OSError as e:
            raise ChannelError(f"slack chat.postEphemeral failed: {e}") from e

    def react(self, channel: str, ts: str, name: str) -> None:
        """``reactions.add``, paced; a reaction already there is not an error."""
        self._limiter.acquire([(pace_key(channel), self._interval)])
        try:
            self.client().reactions_add(channel=channel, timestamp=ts, name=name)
        except SlackApiError as e:
            if describe(e)[1] != "already_reacted":
                raise ChannelError(f"slack reactions.add failed: {describe(e)[1]}") from e
        except OSError as e:
            raise ChannelError(f"slack reactions.add failed: {e}") from e

    def upload(self, channel: str, thread_ts: str | None, data: bytes, filename: str,
               comment: str) -> None:
        """A file into the channel (and thread) with ``comment`` (mrkdwn, may be empty):
        ``files_upload_v2`` (``files.getUploadURLExternal``, the upload, then
        ``files.completeUploadExternal``), paced; one attempt."""
        self._limiter.acquire([(pace_key(channel), self._interval)])
        try:
            self.client().files_upload_v2(channel=channel, thread_ts=thread_ts, content=data,
                                          filename=filename, title=filename,
                                          initial_comment=comment or None)
        except (SlackApiError, SlackRequestError) as e:
            error = describe(e)[1] if isinstance(e, SlackApiError) else str(e)
            raise ChannelError(f"slack file upload failed: {error}") from e
        except OSError as e:
            raise ChannelError(f"slack file upload failed: {e}") from e

    def delete(self, channel: str, ts: str) -> None:
        try:
            self.client().chat_delete(channel=channel, ts=ts)
        except SlackApiError as e:
            raise ChannelError(f"slack chat.delete failed: {describe(e)[1]}") from e
        except OSError as e:
            raise ChannelError(f"slack chat.delete failed: {e}") from e

    def call(self, channel: str, method: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """A live change (``method`` with ``args``), once, its caller having waited for the pace:
        a 429 blocks the channel's pace for Slack's ``Retry-After`` and raises RateLimited."""
        try:
            answer = self.client().api_call(method, json=args)
        except SlackApiError as e:
            status, error = describe(e)
            if status == 429:
                wait = retry_after(e)
                self._limiter.block(pace_key(channel), wait)
                raise RateLimited(f"slack {method}: {error}", wait) from e
            raise ChannelError(f"slack {method} failed: {error}") from e
        except OSError as e:
            raise ChannelError(f"slack {method} failed: {e}") from e
        data = answer.data
        return data if isinstance(data, dict) else None

    # -- retried ------------------------------------------------------------------------------

    def update(self, channel: str, ts: str, text: str,
               blocks: list[dict[str, Any]] | None = None) -> bool:
        """Put ``text`` (and ``blocks``) in the message ``ts`` (paced, 429s and 5xx retried);
        False when Slack no longer has it or it cannot be edited (then it is posted anew)."""
        limit = pace_key(channel)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self._limiter.acquire([(limit, self._interval)])
            try:
                self.client().chat_update(channel=channel, ts=ts, text=text, blocks=blocks)
                return True
            except SlackApiError as e:
                status, error = describe(e)
                if error in _GONE_ERRORS:
                    log.warning("slack: the live message cannot take the reply (%s); "
                                "posting it anew", error)
                    return False
                if attempt == MAX_ATTEMPTS or not (status == 429 or status >= 500):
                    raise ChannelError(f"slack chat.update failed: {error}") from e
                wait = retry_after(e) if status == 429 else 0.5 * 2 ** (attempt - 1)
                log.warning("slack chat.update %s (%s); retrying in %.1fs", status, error, wait)
                if status == 429:
                    self._limiter.block(limit, wait)
                self._sleep(wait)
            except OSError as e:
                if attempt == MAX_ATTEMPTS:
                    raise ChannelError(f"slack chat.update failed: {e}") from e
                self._sleep(0.5 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def post(self, channel: str, text: str, thread_ts: str | None,
             blocks: list[dict[str, Any]] | None = None) -> None:
        """``chat.postMessage`` (paced, 429s, 5xx and connection errors retried)."""
        limit = pace_key(channel)
        args: dict[str, Any] = {"channel": channel, "text": text, "unfurl_links": False}
        if thread_ts:
            args["thread_ts"] = thread_ts
        if blocks is not None:
            args["blocks"] = blocks
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self._limiter.acquire([(limit, self._interval)])
            try:
                self.client().chat_postMessage(**args)
                return
            except SlackApiError as e:
                status, error = describe(e)
                if attempt == MAX_ATTEMPTS or not (status == 429 or status >= 500):
                    raise ChannelError(f"slack chat.postMessage failed: {error}") from e
                wait = retry_after(e) if status == 429 else 0.5 * 2 ** (attempt - 1)
                log.warning("slack chat.postMessage %s (%s); retrying in %.1fs",
                            status, error, wait)
                if status == 429:
                    self._limiter.block(limit, wait)
                self._sleep(wait)
            except OSError as e:  # connection refused or reset, timeout
                if attempt == MAX_ATTEMPTS:
                    raise ChannelError(f"slack chat.postMessage failed: {e}") from e
                wait = 0.5 * 2 ** (attempt - 1)
                log.warning("slack chat.postMessage unreachable (%s); retrying in %.1fs", e, wait)
                self._sleep(wait)


def describe(e: SlackApiError) -> tuple[int, str]:
    """HTTP status and Slack's ``error`` code of a failed call."""
    response = e.response
    status = int(getattr(response, "status_code", 0) or 0)
    data = getattr(response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    return status, str(error or f"http {status}")


def retry_after(e: SlackApiError) -> float:
    headers = getattr(e.response, "headers", None) or {}
    for name, value in headers.items():
        if name.lower() == "retry-after":
            raw = value[0] if isinstance(value, list) else value
            try:
                return max(float(raw), 0.0)
            except (TypeError, ValueError):
                break
    return 1.0


def safe(e: BaseException) -> str:
    """An error for the log: Slack's error code, never the request (which holds the token)."""
    if isinstance(e, SlackApiError):
        return describe(e)[1]
    return type(e).__name__ + (f": {e}" if str(e) else "")
