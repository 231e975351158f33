"""Network tools: ``http_fetch`` reads one web page or text resource.

Its result is external content, so the registry fences it (policy ``network``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import httpx

from fermix_worker.tools.base import Tool, ToolError

FETCH_TIMEOUT_S = 15.0
FETCH_MAX_BYTES = 200_000
# How much of a non-2xx body the model sees next to the status (APIs explain errors there).
ERROR_BODY_CHARS = 500

_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript",
               "application/x-www-form-urlencoded")
_TEXT_SUFFIXES = ("+json", "+xml")


def _is_text(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return not mime or mime.startswith(_TEXT_TYPES) or mime.endswith(_TEXT_SUFFIXES)


def _parse_url(raw: Any) -> httpx.URL:
    text = str(raw or "").strip()
    if not text:
        raise ToolError("url is required")
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as e:
        raise ToolError(f"invalid url {text!r}: {e}") from e
    if url.scheme not in ("http", "https"):
        raise ToolError(f"only http and https URLs can be fetched, not {url.scheme or 'none'!r}")
    if not url.host:
        raise ToolError(f"url {text!r} has no host")
    return url


def _private_allowed() -> bool:
    return os.environ.get("FERMIX_HTTP_FETCH_ALLOW_PRIVATE", "").lower() in ("1", "true", "yes")


def _check_host(host: str) -> None:
    """Refuse loopback, private, link-local (cloud metadata) and reserved addresses, so a
    prompt-injected turn cannot read internal services. FERMIX_HTTP_FETCH_ALLOW_PRIVATE=true
    lifts this (e.g. for an intranet deployment)."""
    if _private_allowed():
        return
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise ToolError(f"cannot resolve {host!r}: {e}") from e
    for info in infos:
        ip = ipaddress.ip_address(info[4][0])
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast:
            raise ToolError(f"refusing to fetch {host!r}: it resolves to a private or local address")


def _read_capped(response: httpx.Response) -> tuple[bytes, bool]:
    """At most FETCH_MAX_BYTES of the body, and whether there was more."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body.extend(chunk)
        if len(body) > FETCH_MAX_BYTES:
            return bytes(body[:FETCH_MAX_BYTES]), True
    return bytes(body), False


def _decode(response: httpx.Response, body: bytes) -> str:
    if b"\x00" in body[:4096]:
        raise ToolError(f"{response.url} returned binary content, not text")
    try:
        return body.decode(response.encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


def _http_fetch(args: dict[str, Any]) -> str:
    url = _parse_url(args.get("url"))
    # Checked for the first request and for every redirect hop.
    hooks = {"request": [lambda req: _check_host(req.url.host)]}
    try:
        with httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=True, event_hooks=hooks) as client, \
                client.stream("GET", url, headers={"Accept": "text/*, application/json"}) as r:
            content_type = r.headers.get("content-type", "")
            status = f"{r.http_version} {r.status_code} {r.reason_phrase}".rstrip()
            if not r.is_success:
                body, _ = _read_capped(r) if _is_text(content_type) else (b"", False)
                excerpt = body[:ERROR_BODY_CHARS].decode("utf-8", errors="replace").strip()
                raise ToolError(f"{status} from {r.url}" + (f"\n{excerpt}" if excerpt else ""))
            if not _is_text(content_type):
                raise ToolError(f"{r.url} returned {content_type}, not text")
            body, cut = _read_capped(r)
            text = _decode(r, body)
    except httpx.TimeoutException as e:
        raise ToolError(f"fetching {url} timed out after {FETCH_TIMEOUT_S:g} s") from e
    except httpx.HTTPError as e:
        raise ToolError(f"fetching {url} failed: {type(e).__name__}: {e}") from e
    head = [status, f"URL: {r.url}"]
    if content_type:
        head.append(f"Content-Type: {content_type}")
    tail = f"\n[truncated at {FETCH_MAX_BYTES // 1000} KB]" if cut else ""
    return "\n".join(head) + "\n\n" + text + tail


HTTP_FETCH = Tool(
    name="http_fetch",
    description=(
        "Fetch an http(s) URL with GET and return its status and text "
        f"(text content only, at most {FETCH_MAX_BYTES // 1000} KB read)."
    ),
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "description": "An http:// or https:// URL"}},
        "required": ["url"],
    },
    run=_http_fetch,
    policy="network",
    idempotent=True,
)
