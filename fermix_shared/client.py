"""CLI client commands that talk to a running gateway: ``fermix agent``."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import httpx

from fermix_shared.errors import FermixError
from fermix_shared.settings import Settings


class ClientError(FermixError):
    """A failure the CLI reports as one sentence with a non-zero exit code."""


def _headers(settings: Settings) -> dict[str, str]:
    if settings.api_token is None:
        return {}
    return {"Authorization": f"Bearer {settings.api_token.get_secret_value()}"}


def _sse(resp: httpx.Response) -> Any:
    """Parse ``event:``/``data:`` blocks from an SSE response."""
    event, data = "message", ""
    for line in resp.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif not line and data:
            yield event, json.loads(data)
            event, data = "message", ""


def run_agent(
    settings: Settings,
    message: str,
    chat: str | None,
    timeout: float,
    out: TextIO = sys.stdout,
) -> int:
    """Start a run, stream its reply to ``out``; returns the exit code (0 ok, 1 failed)."""
    base = settings.gateway_url.rstrip("/")
    body: dict[str, Any] = {"message": message}
    if chat:
        body["chatId"] = chat
    try:
        with httpx.Client(base_url=base, headers=_headers(settings), timeout=httpx.Timeout(timeout, connect=5)) as http:
            resp = http.post("/v1/agent", json=body)
            if resp.status_code != 202:
                raise ClientError(f"the gateway refused the message (HTTP {resp.status_code}): {resp.text}")
            run_id = resp.json()["runId"]
            streamed = False
            with http.stream("GET", f"/v1/runs/{run_id}/events") as events:
                for stream, data in _sse(events):
                    if stream == "assistant":
                        out.write(data.get("delta", ""))
                        out.flush()
                        streamed = True
                    elif stream == "lifecycle" and data.get("phase") in ("end", "error"):
                        break
            final = http.get(f"/v1/runs/{run_id}").json()
    except httpx.ConnectError as e:
        raise ClientError(f"cannot reach the gateway at {base} ({e}); is `fermix dev` running?") from e
    except httpx.TimeoutException as e:
        raise ClientError(f"the gateway at {base} did not answer within {timeout:.0f} s") from e
    if final.get("status") == "ok":
        # The streamed text may include a silent token the final reply drops; print the reply
        # itself when nothing was streamed or when they differ.
        if not streamed:
            out.write(final.get("reply", ""))
        out.write("\n")
        return 0
    if streamed:
        out.write("\n")
    raise ClientError(f"run {run_id} ended {final.get('status')}: {final.get('error', 'no reply')}")


def get_status(settings: Settings) -> dict[str, Any]:
    """``GET /v1/status`` from the gateway, as parsed JSON."""
    base = settings.gateway_url.rstrip("/")
    try:
        resp = httpx.get(f"{base}/v1/status", headers=_headers(settings),
                         timeout=httpx.Timeout(10, connect=5))
    except httpx.ConnectError as e:
        raise ClientError(f"cannot reach the gateway at {base} ({e}); is `fermix dev` running?") from e
    except httpx.TimeoutException as e:
        raise ClientError(f"the gateway at {base} did not answer within 10 s") from e
    if resp.status_code != 200:
        raise ClientError(
            f"the gateway refused the status request (HTTP {resp.status_code}): {resp.text[:200]}"
        )
    status: dict[str, Any] = resp.json()
    return status


def format_status(status: dict[str, Any]) -> str:
    """A few readable lines for ``fermix status``."""
    workers = ", ".join(f"{w['name']} {w['lastSeenAgo']:.0f}s ago" for w in status["workers"])
    provider = status["provider"]
    lines = [
        f"workers seen: {status['workersSeen']}" + (f" ({workers})" if workers else ""),
        f"active conversations: {status['activeConversations']}, "
        f"pending conversations: {status['pendingConversations']}, "
        f"active requests: {status['activeRequests']}, "
        f"pending requests: {status['pendingRequests']}",
        f"provider: {provider['primary']} (model {provider['model']}), "
        f"fallbacks: {', '.join(provider['fallbacks']) or 'none'}",
    ]
    for c in status["conversations"]:
        state = "idle"
        if c["active"]:
            state = f"active, lease expires in {c['leaseExpiresIn']:.0f}s"
        lines.append(f"  {c['conversation']}: {state}, {c['pending']} pending")
    return "\n".join(lines)
