"""``fermix doctor``: the chat channels that have a bot token.

Telegram: ``getMe`` (the token works) and ``getWebhookInfo`` (a webhook is set and Telegram
reached it last time) at ``FERMIX_TELEGRAM_API_BASE``. Slack: ``auth.test`` through
``slack_sdk``'s WebClient at ``FERMIX_SLACK_API_BASE``. Each also needs the secret the gateway
checks inbound traffic with, or the gateway refuses every webhook (403). Tokens and secrets
are only ever said to be present or not; anything quoted from the platforms is scrubbed of
the token, which Telegram carries in every URL.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from fermix_cli.doctor.check import Check, clip, scrub
from fermix_shared.errors import FermixError
from fermix_shared.settings import Settings

TIMEOUT_S = 5.0


class _TelegramRefused(FermixError):
    """The Bot API refused a doctor call, or gave no usable answer (``status`` None)."""

    def __init__(self, status: int | None, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


def _telegram(client: httpx.Client, base: str, token: str, method: str) -> dict[str, Any]:
    try:
        response = client.post(f"{base.rstrip('/')}/bot{token}/{method}", json={})
        body = response.json()
    except httpx.HTTPError as e:
        raise _TelegramRefused(None, type(e).__name__) from e
    except ValueError as e:
        raise _TelegramRefused(response.status_code, "the answer is not JSON") from e
    if not (isinstance(body, dict) and body.get("ok") is True):
        description = body.get("description") if isinstance(body, dict) else None
        raise _TelegramRefused(response.status_code, str(description or "no description"))
    result = body.get("result")
    return result if isinstance(result, dict) else {}


def check_webhook_info(info: dict[str, Any], now: float) -> Check:
    """Telegram's own view of our webhook: set or not, and its last delivery error."""
    url = str(info.get("url") or "")
    if not url:
        return Check("telegram.webhook", "warn",
                     "no webhook is set: Telegram delivers no updates to the gateway.",
                     "fermix telegram set-webhook https://YOUR-HOST/webhooks/telegram")
    pending = int(info.get("pending_update_count") or 0)
    error = info.get("last_error_message")
    if error:
        ago = now - float(info.get("last_error_date") or now)
        return Check("telegram.webhook", "warn",
                     f"Telegram's delivery to {url} failed {max(ago, 0):.0f} s ago: "
                     f"{clip(str(error))} ({pending} update{'' if pending == 1 else 's'} "
                     "pending).",
                     "make sure the gateway answers at that URL over HTTPS and its "
                     "FERMIX_TELEGRAM_WEBHOOK_SECRET is the one set with the webhook")
    return Check("telegram.webhook", "ok",
                 f"webhook set to {url}, no delivery errors ({pending} pending).")


def telegram_checks(settings: Settings) -> list[Check]:
    if settings.telegram_bot_token is None:
        return [Check("telegram", "ok",
                      "not configured (FERMIX_TELEGRAM_BOT_TOKEN is unset): skipped.")]
    token = settings.telegram_bot_token.get_secret_value()
    base = settings.telegram_api_base
    checks = []
    with httpx.Client(timeout=TIMEOUT_S) as client:
        try:
            me = _telegram(client, base, token, "getMe")
            checks.append(Check("telegram", "ok",
                                f"bot @{me.get('username', '?')} answers getMe at {base}."))
            checks.append(check_webhook_info(_telegram(client, base, token, "getWebhookInfo"),
                                             time.time()))
        except _TelegramRefused as e:
            said = clip(scrub(e.description, [token]))
            if e.status == 401:
                message, fix = (f"Telegram at {base} refused the bot token (401: {said}).",
                                "check FERMIX_TELEGRAM_BOT_TOKEN (BotFather's /token shows "
                                "the current one)")
            else:
                outcome = f"answered {e.status}: {said}" if e.status else f"no answer ({said})"
                message, fix = (f"Telegram at {base} did not confirm the bot: {outcome}.",
                                "check FERMIX_TELEGRAM_API_BASE, FERMIX_TELEGRAM_BOT_TOKEN and "
                                "that this host can reach the API")
            checks.append(Check("telegram", "fail", message, fix))
    if settings.telegram_webhook_secret is None:
        checks.append(Check("telegram.secret", "fail",
                            "FERMIX_TELEGRAM_WEBHOOK_SECRET is not set: the gateway refuses "
                            "every update (403).",
                            "set it to a long random string on the gateway, then run "
                            "`fermix telegram set-webhook URL` to register it"))
    return checks


def slack_checks(settings: Settings) -> list[Check]:
    if settings.slack_bot_token is None:
        return [Check("slack", "ok", "not configured (FERMIX_SLACK_BOT_TOKEN is unset): skipped.")]
    token = settings.slack_bot_token.get_secret_value()
    base = settings.slack_api_base
    checks = [_auth_test(token, base)]
    if settings.slack_signing_secret is None:
        checks.append(Check("slack.secret", "fail",
                            "FERMIX_SLACK_SIGNING_SECRET is not set: the gateway refuses every "
                            "event and command (403).",
                            "set it to the app's Signing Secret (Basic Information page)"))
    return checks


def _auth_test(token: str, base: str) -> Check:
    client = WebClient(token=token, base_url=base.rstrip("/") + "/", timeout=int(TIMEOUT_S),
                       retry_handlers=[])
    try:
        me = client.auth_test()
    except SlackApiError as e:
        error = clip(scrub(str(e.response.get("error") or e.response.status_code), [token]))
        return Check("slack", "fail", f"Slack auth.test at {base} refused the bot token: "
                     f"{error}.",
                     "check FERMIX_SLACK_BOT_TOKEN (the Bot User OAuth Token, xoxb-...)")
    except Exception as e:  # urllib's errors and timeouts: the API never answered
        return Check("slack", "fail", f"Slack at {base} did not answer auth.test "
                     f"({type(e).__name__}).",
                     "check FERMIX_SLACK_API_BASE and that this host can reach it")
    return Check("slack", "ok", f"auth.test at {base}: bot {me.get('user', '?')} "
                 f"({me.get('user_id', '?')}) in team {me.get('team_id', '?')}.")
