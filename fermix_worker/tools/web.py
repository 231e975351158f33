"""Network tools: ``http_fetch`` reads one web page or text resource.

Its result is external content, so the registry fences it (policy ``network``). An HTML page
comes back as Markdown of its main content, links kept (:mod:`fermix_worker.tools.web_text`);
``raw`` returns its HTML as read instead. Other text (plain text, JSON, XML) comes back as
read. Whatever the form, the model reads at most FETCH_MAX_CHARS of it from ``offset``
(:func:`~fermix_worker.tools.web_text.window`), and the note under a cut names the offset
that reads on.

It fetches only from public addresses (:func:`is_public`), unless
FERMIX_HTTP_FETCH_ALLOW_PRIVATE=true. The check sits in the network backend that opens every
connection, the first request's and each redirect hop's: :class:`CheckedBackend` resolves the
host once, judges every address, and connects to the very address it judged. No second lookup
happens between check and connect, so a DNS answer that changes in between (rebinding) cannot
steer the connection to an internal service. Environment proxies are ignored for the same
reason: a proxy would connect on our behalf, unchecked.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Iterable
from typing import Any

import httpcore
import httpx

from fermix_worker.tools.base import Tool, ToolError
from fermix_worker.tools.web_text import readable, window

FETCH_TIMEOUT_S = 15.0
FETCH_MAX_BYTES = 200_000
# Text (Markdown, raw HTML, plain text) beyond this is cut, with a note saying where to read
# on: ~4,000 tokens, under the registry's MAX_RESULT_CHARS (20,000) with room for the status
# lines, so that the cut is ours, at a line end, and says what it left out.
FETCH_MAX_CHARS = 16_000
# How much of a non-2xx body the model sees next to the status (APIs explain errors there; an
# HTML error page is shown as Markdown).
ERROR_BODY_CHARS = 500

_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript",
               "application/x-www-form-urlencoded")
_TEXT_SUFFIXES = ("+json", "+xml")
_HTML_TYPES = ("text/html", "application/xhtml+xml")


def _mime(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_text(content_type: str) -> bool:
    mime = _mime(content_type)
    return not mime or mime.startswith(_TEXT_TYPES) or mime.endswith(_TEXT_SUFFIXES)


def _is_html(content_type: str, text: str) -> bool:
    """HTML by its type, or, when the server sent none, by how the text starts."""
    mime = _mime(content_type)
    if mime:
        return mime in _HTML_TYPES
    return text.lstrip()[:14].lower().startswith(("<!doctype html", "<html"))


def _raw_arg(args: dict[str, Any]) -> bool:
    raw = args.get("raw", False)
    if not isinstance(raw, bool):
        raise ToolError("raw must be true or false")
    return raw


def _offset_arg(args: dict[str, Any]) -> int:
    offset = args.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ToolError(f"offset must be a whole number of characters, 0 or more, not {offset!r}")
    return offset


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


# IPv6 ranges that carry an IPv4 address in their last 32 bits (besides IPv4-mapped and 6to4,
# which ipaddress unwraps itself): NAT64 and the deprecated IPv4-compatible form.
_EMBEDS_IPV4 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("::/96"))


def _unwrap(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> (
        ipaddress.IPv4Address | ipaddress.IPv6Address):
    """The IPv4 address an IPv6 address stands for, if it embeds one: that is where the
    packets go (``::ffff:127.0.0.1`` is loopback)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _EMBEDS_IPV4):
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return ip


def is_public(address: str) -> bool:
    """True only for a globally routable unicast address (an allow rule, not a deny list).

    Refused: loopback, private, link-local (cloud metadata at 169.254.169.254), the shared
    address space 100.64.0.0/10 (where some clouds serve metadata too), documentation,
    benchmarking and reserved ranges, the unspecified address and multicast; IPv6 addresses
    that embed an IPv4 one are judged by that IPv4 address.
    """
    try:
        ip = _unwrap(ipaddress.ip_address(address))
    except ValueError:
        return False
    return ip.is_global and not ip.is_multicast


Resolver = Callable[[str, int], list[str]]
"""Host name and port to the IP addresses (strings) to try, in order."""

Connector = Callable[[str, int, float | None], httpcore.NetworkStream]
"""Opens a TCP connection to an IP address and port within a timeout (seconds or None)."""


def resolve(host: str, port: int) -> list[str]:
    """The system resolver's addresses for ``host``, duplicates dropped."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class CheckedBackend(httpcore.SyncBackend):
    """A network backend that connects only to checked addresses, and to exactly those.

    ``connect_tcp`` resolves the host once with ``resolver`` (an IP literal is not resolved),
    refuses it with a :class:`ToolError` if any of its addresses is not public (unless
    ``allow_private``), then tries the checked addresses in order with ``connector`` (default:
    a plain TCP connection). TLS is started on top by httpcore with the host *name* for SNI
    and certificate verification, so https still authenticates the site.
    """

    def __init__(self, resolver: Resolver = resolve, connector: Connector | None = None,
                 *, allow_private: bool = False) -> None:
        self._resolver = resolver
        self._connector = connector
        self._allow_private = allow_private

    def addresses(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for ``host``, all checked."""
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                addresses = self._resolver(host, port)
            except OSError as e:  # socket.gaierror
                raise ToolError(f"cannot resolve {host!r}: {e}") from e
        if not addresses:
            raise ToolError(f"cannot resolve {host!r}: no addresses")
        if not self._allow_private:
            for ip in addresses:
                if not is_public(ip):
                    raise ToolError(
                        f"refusing to fetch {host!r}: it resolves to a private or local address ({ip})"
                    )
        return addresses

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        error: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for ip in self.addresses(host, port):
            try:
                if self._connector is not None:
                    return self._connector(ip, port, timeout)
                return super().connect_tcp(ip, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                error = e
        assert error is not None
        raise error


def default_backend() -> CheckedBackend:
    """The backend of the built-in tool: the system resolver, plain TCP, and
    FERMIX_HTTP_FETCH_ALLOW_PRIVATE as it is at the time of the fetch."""
    return CheckedBackend(allow_private=_private_allowed())


class _CheckedTransport(httpx.HTTPTransport):
    """httpx's own transport, over a connection pool that connects through ``backend``."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        ssl_context = httpx.create_ssl_context()
        super().__init__(verify=ssl_context, trust_env=False)
        # httpx takes no network backend, so swap in the same pool built with ours.
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=backend)


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
    return _text(response, body)


def _text(response: httpx.Response, body: bytes) -> str:
    try:
        return body.decode(response.encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


def _http_fetch(args: dict[str, Any], backend: httpcore.NetworkBackend) -> str:
    url = _parse_url(args.get("url"))
    raw = _raw_arg(args)
    offset = _offset_arg(args)
    # Every connection, the first request's and each redirect hop's, opens through `backend`;
    # trust_env=False: no environment proxy (it would connect unchecked), no .netrc.
    transport = _CheckedTransport(backend)
    try:
        with httpx.Client(transport=transport, timeout=FETCH_TIMEOUT_S, follow_redirects=True,
                          trust_env=False) as client, \
                client.stream("GET", url, headers={"Accept": "text/*, application/json"}) as r:
            content_type = r.headers.get("content-type", "")
            status = f"{r.http_version} {r.status_code} {r.reason_phrase}".rstrip()
            if not r.is_success:
                body, _ = _read_capped(r) if _is_text(content_type) else (b"", False)
                excerpt = _error_excerpt(_text(r, body), str(r.url), content_type)
                raise ToolError(f"{status} from {r.url}" + (f"\n{excerpt}" if excerpt else ""))
            if not _is_text(content_type):
                raise ToolError(f"{r.url} returned {content_type}, not text")
            body, cut = _read_capped(r)
            text = _decode(r, body)
    except httpx.TimeoutException as e:
        raise ToolError(f"fetching {url} timed out after {FETCH_TIMEOUT_S:g} s") from e
    except httpx.HTTPError as e:
        raise ToolError(f"fetching {url} failed: {type(e).__name__}: {e}") from e
    return _result(status, str(r.url), content_type, text, cut, raw, offset)


def _error_excerpt(text: str, url: str, content_type: str) -> str:
    """At most ERROR_BODY_CHARS of an error body: an HTML page's as Markdown (its title when
    it has no readable text), other text as read."""
    if not _is_html(content_type, text):
        return text[:ERROR_BODY_CHARS].strip()
    page = readable(text, url, ERROR_BODY_CHARS)
    return page.text.strip() or page.title or ""


def _result(status: str, url: str, content_type: str, text: str, cut: bool, raw: bool,
            offset: int) -> str:
    """What the model reads: the status lines, then the window of the text from ``offset``
    (an HTML page's text is its Markdown unless ``raw``), then what was left out."""
    head = [status, f"URL: {url}"]
    if content_type:
        head.append(f"Content-Type: {content_type}")
    if raw or not _is_html(content_type, text):
        shown, note = window(text, offset, FETCH_MAX_CHARS)
    else:
        page = readable(text, url, FETCH_MAX_CHARS, offset)
        if page.title:
            head.append(f"Title: {page.title}")
        shown, note = page.text, page.note
    notes = [note] if note else []
    if cut:
        notes.append(f"[only the first {FETCH_MAX_BYTES // 1000} KB of the response was read]")
    return "\n\n".join(part for part in ["\n".join(head), shown, *notes] if part)


def http_fetch_tool(backend: Callable[[], httpcore.NetworkBackend] = default_backend) -> Tool:
    """The ``http_fetch`` tool; each fetch opens its connections through a fresh ``backend()``."""
    return Tool(
        name="http_fetch",
        description=(
            "Fetch an http(s) URL with GET and return its status and text (text content only, "
            f"at most {FETCH_MAX_BYTES // 1000} KB read). An HTML page comes back as Markdown "
            "of its main content with its links; raw=true returns its HTML instead. At most "
            f"{FETCH_MAX_CHARS:,} characters come back at a time: a longer text ends with a "
            "note giving the offset to call again with for the rest."
        ),
        parameters={
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "An http:// or https:// URL"},
                "raw": {"type": "boolean", "description": "Return an HTML page's HTML as "
                        "fetched instead of Markdown (default false)"},
                "offset": {"type": "integer", "minimum": 0, "description": "Where to start "
                           "reading, in characters into the returned text (the Markdown, or "
                           "the raw text); a cut result's note gives the next one (default 0)"},
            },
            "required": ["url"],
        },
        run=lambda ctx, args: _http_fetch(args, backend()),
        policy="network",
        idempotent=True,
    )


HTTP_FETCH = http_fetch_tool()
